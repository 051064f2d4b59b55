"""The `berth` command: components, the local control plane and small tools.

Each sub-command is a thin shell over a library function; errors a user can fix are
printed as one line naming the problem, with exit code 1, never as a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from berth import migrate, tls
from berth.dev.binaries import BuildError, ensure_binaries
from berth.dev.cluster import ClusterError, ClusterSpec, LocalCluster
from berth.settings import ConfigError
from controller import cli as controller_cli
from extender import cli as extender_cli
from webhook import cli as webhook_cli

Handler = Callable[[argparse.Namespace], int]


def _dev_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    spec = ClusterSpec(
        nodes=args.nodes,
        node_cpu=args.node_cpu,
        node_memory=args.node_memory,
        node_pods=args.node_pods,
    )
    cluster.up(spec)
    for component in cluster.components:
        print(f"{component.name:<24} pid {component.pid:<8} port {component.port}")
    print(f"logs: {cluster.logs}")
    print(_export_line(cluster))
    return 0


def _dev_build(args: argparse.Namespace) -> int:
    print(ensure_binaries().bin_dir)
    return 0


def _dev_env(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    if not cluster.running() or cluster.binaries is None:
        print(f"berth: no local cluster runs from {cluster.state_dir}", file=sys.stderr)
        return 1
    print(_export_line(cluster))
    return 0


def _export_line(cluster: LocalCluster) -> str:
    assert cluster.binaries is not None
    return f"export KUBECONFIG={cluster.kubeconfig} PATH={cluster.binaries.bin_dir}:$PATH"


def _dev_demo(args: argparse.Namespace) -> int:
    from berth.dev import demo

    cluster = LocalCluster(args.state_dir)
    if not cluster.running():
        print(
            f"berth: no local cluster runs from {cluster.state_dir}; run `berth dev up`",
            file=sys.stderr,
        )
        return 1
    return asyncio.run(demo.run(cluster.kubeconfig))


def _dev_down(args: argparse.Namespace) -> int:
    stopped = LocalCluster(args.state_dir).down()
    print(f"stopped: {', '.join(stopped)}" if stopped else "no local cluster was running")
    return 0


def _dev_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    report = cluster.status()
    if not report:
        print(f"no local cluster in {cluster.state_dir}")
        return 1
    for component, healthy, seen in report:
        state = "healthy" if healthy else "UNHEALTHY"
        print(
            f"{component.name:<24} pid {component.pid:<8} port {component.port:<6} "
            f"{state}  {seen[:60]}"
        )
    print(f"kubeconfig: {cluster.kubeconfig}")
    return 0 if all(healthy for _, healthy, _ in report) else 1


def _certs(args: argparse.Namespace) -> int:
    paths = tls.write_serving_set(args.out, dns_names=tuple(args.dns), ip_addresses=tuple(args.ip))
    for path in paths:
        print(path)
    return 0


def _crds(args: argparse.Namespace) -> int:
    from berth.crds import write_crds

    for path in write_crds(args.out):
        print(path)
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="berth", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    dev = commands.add_parser("dev", help="a local control plane for tests and the demo")
    dev_commands = dev.add_subparsers(dest="dev_command", required=True)
    for name, handler, help_text in (
        (
            "up",
            _dev_up,
            "start etcd, kube-apiserver, kube-controller-manager, "
            "kube-scheduler, kwok and fake nodes",
        ),
        ("down", _dev_down, "stop exactly the processes `up` started"),
        ("status", _dev_status, "show each component and its health"),
        ("env", _dev_env, "print the line that points kubectl at the running cluster"),
        ("build", _dev_build, "build (or reuse) the control plane binaries; print their dir"),
        ("demo", _dev_demo, "defragment the running cluster with reservation-first migrations"),
    ):
        sub = dev_commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--state-dir",
            type=Path,
            default=None,
            help="where state, logs and the kubeconfig live (default: $XDG_STATE_HOME/berth/dev)",
        )
        sub.set_defaults(handler=handler)
        if name == "up":
            sub.add_argument("--nodes", type=int, default=3, help="fake nodes (default 3)")
            sub.add_argument("--node-cpu", default="8", help="CPU of each node (default 8)")
            sub.add_argument(
                "--node-memory", default="16Gi", help="memory of each node (default 16Gi)"
            )
            sub.add_argument(
                "--node-pods", type=int, default=110, help="pod capacity of each node (default 110)"
            )

    certs = commands.add_parser("certs", help="make a self-signed CA and a serving certificate")
    certs.add_argument("--out", type=Path, required=True, help="directory for ca/tls files")
    certs.add_argument("--dns", action="append", default=[], help="a DNS name (repeatable)")
    certs.add_argument("--ip", action="append", default=[], help="an IP address (repeatable)")
    certs.set_defaults(handler=_certs)

    controller_cli.add_parser(commands)
    webhook_cli.add_parser(commands)
    extender_cli.add_parser(commands)
    migrate.add_parser(commands)

    crds = commands.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument(
        "--out",
        type=Path,
        default=Path("manifests/crds"),
        help="directory (default manifests/crds)",
    )
    crds.set_defaults(handler=_crds)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (ClusterError, BuildError, ConfigError, ValueError) as error:
        print(f"berth: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
