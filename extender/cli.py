"""`berth extender`: run the kube-scheduler extender."""

from __future__ import annotations

import argparse
import sys

from kubernetes_asyncio.config import ConfigException

from berth import log, server
from berth.exits import BAD_CONFIG, CONFIG_ERRORS, bad_config
from berth.kube.client import add_kubeconfig_argument
from extender.app import run
from extender.decide import Placement


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "extender",
        help="the kube-scheduler extender that keeps reserved capacity for the "
        "pods it was reserved for",
    )
    add_kubeconfig_argument(parser)
    server.add_listen_arguments(parser, default_port=8443)
    server.add_tls_arguments(
        parser,
        plain="anyone on the network path can read and forge what kube-scheduler and the "
        "extender say to each other",
    )
    parser.add_argument(
        "--placement",
        type=Placement,
        choices=list(Placement),
        default=Placement.SPREAD,
        help="where placeholder pods go: spread (most free capacity left) "
        "or binpack (least left, to defragment); default spread",
    )
    server.add_arguments(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    problem = server.serving_problem(args)
    if problem:
        print(f"berth extender: {problem}", file=sys.stderr)
        return BAD_CONFIG
    tls = server.tls_from(args)
    log.setup()
    try:
        run(
            kubeconfig=args.kubeconfig,
            host=args.host,
            port=args.port,
            tls=tls,
            limits=server.limits_from(args),
            placement=args.placement,
        )
    except CONFIG_ERRORS as error:
        return bad_config("berth extender", error)
    except (OSError, ConfigException) as error:  # unreadable certificate, port in use, ...
        print(f"berth extender: {error}", file=sys.stderr)
        return 1
    return 0
