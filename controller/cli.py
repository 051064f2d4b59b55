"""`berth controller`: run the PodMigrationJob controller."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

import aiohttp

from berth import log, server
from berth.exits import BAD_CONFIG, CONFIG_ERRORS, bad_config
from berth.kube.client import KubeError, add_kubeconfig_argument
from berth.settings import load_args
from controller.app import run


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("controller", help="run the PodMigrationJob controller")
    add_kubeconfig_argument(parser)
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="MigrationControllerArgs YAML (default: all defaults)",
    )
    parser.add_argument(
        "--lease-namespace",
        default="berth-system",
        help="namespace of the leader-election Lease (default berth-system)",
    )
    parser.add_argument(
        "--health-port",
        type=server.port,
        default=8080,
        help="port of /healthz, /readyz and /metrics (default 8080)",
    )
    server.add_tls_arguments(
        parser, plain="anyone on the network path can read the controller's metrics"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    problem = server.serving_problem(args)
    if problem:
        print(f"berth controller: {problem}", file=sys.stderr)
        return BAD_CONFIG
    try:
        settings = load_args(args.config) if args.config else None
        log.setup()
        with contextlib.suppress(asyncio.CancelledError):  # SIGTERM or SIGINT: a normal stop
            asyncio.run(
                run(
                    kubeconfig=args.kubeconfig,
                    settings=settings,
                    lease_namespace=args.lease_namespace,
                    health_port=args.health_port,
                    tls=server.tls_from(args),
                )
            )
    except CONFIG_ERRORS as error:
        return bad_config("berth controller", error)
    except KubeError as error:  # the admission key's Secret, before anything else is read
        print(
            f"berth controller: the API server refused to start it ({error}); check "
            f"--lease-namespace {args.lease_namespace} and the controller's RBAC",
            file=sys.stderr,
        )
        return 1
    except (aiohttp.ClientError, OSError) as error:  # unreachable, or a port in use
        print(f"berth controller: {error!r}", file=sys.stderr)
        return 1
    return 0
