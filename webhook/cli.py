"""`berth webhook`: run the admission webhook (pod binding and eviction interception)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kubernetes_asyncio.config import ConfigException

from berth import log, server
from berth.exits import BAD_CONFIG, CONFIG_ERRORS, bad_config
from berth.kube.client import add_kubeconfig_argument
from berth.settings import MigrationControllerArgs, load_args
from webhook.app import DEADLINE, run
from webhook.intercept import CONTROLLER_USER, Interception


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "webhook",
        help="the admission webhook: binds replacement pods to their Reservations, and turns "
        "evictions into PodMigrationJobs",
    )
    add_kubeconfig_argument(parser)
    server.add_listen_arguments(parser, default_port=9443)
    parser.add_argument(
        "--tls-cert-file",
        type=Path,
        required=True,
        help="serving certificate (PEM), e.g. tls.crt from `berth certs`",
    )
    parser.add_argument(
        "--tls-private-key-file", type=Path, required=True, help="its private key (PEM)"
    )
    parser.add_argument(
        "--request-deadline",
        type=server.positive_seconds,
        default=DEADLINE,
        metavar="SECONDS",
        help="time one review's work may take, API calls included; keep it below the "
        f"webhook configuration's timeoutSeconds (default {DEADLINE:g})",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the controller's MigrationControllerArgs YAML, for evictionInterception, "
        "defaultJobMode, defaultJobTTL and namespaces (default: all defaults)",
    )
    parser.add_argument(
        "--controller-user",
        default=CONTROLLER_USER,
        help="the controller's user name, whose evictions are never intercepted "
        f"(default {CONTROLLER_USER})",
    )
    server.add_arguments(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    for path in (args.tls_cert_file, args.tls_private_key_file, args.client_ca_file):
        if path is not None and not path.is_file():
            print(f"berth webhook: {path}: no such file", file=sys.stderr)
            return BAD_CONFIG
    tls = server.Tls(args.tls_cert_file, args.tls_private_key_file, args.client_ca_file)
    problem = tls.problem()
    if problem:
        print(f"berth webhook: {problem}", file=sys.stderr)
        return BAD_CONFIG
    try:
        settings = load_args(args.config) if args.config else MigrationControllerArgs()
    except CONFIG_ERRORS as error:
        return bad_config("berth webhook", error)
    log.setup()
    try:
        run(
            kubeconfig=args.kubeconfig,
            host=args.host,
            port=args.port,
            tls=tls,
            limits=server.limits_from(args),
            deadline=args.request_deadline,
            interception=Interception(settings, args.controller_user),
        )
    except CONFIG_ERRORS as error:
        return bad_config("berth webhook", error)
    except (OSError, ConfigException) as error:  # unreadable certificate, port in use, ...
        print(f"berth webhook: {error}", file=sys.stderr)
        return 1
    return 0
