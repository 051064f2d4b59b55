"""The `berth` command: Berth's components and small tools (and, in a checkout, the local
control plane).

Each sub-command is a thin shell over a library function; errors a user can fix are
printed as one line naming the problem, never as a traceback: exit code 2 for a
configuration that cannot be used (`berth.exits`), 1 for the others.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TypeAlias

from berth import tls
from berth.exits import CONFIG_ERRORS, bad_config
from cli import migrate
from controller import cli as controller_cli
from extender import cli as extender_cli
from webhook import cli as webhook_cli

Handler = Callable[[argparse.Namespace], int]
# Each app's `add_parser` takes this: the `berth` sub-commands.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

# Sub-commands registered from outside the installed packages: `dev` (devtools/) is one,
# present in a checkout, absent from the image.
REGISTERED = "berth.commands"


def _certs(args: argparse.Namespace) -> int:
    paths = tls.write_serving_set(
        args.out, dns_names=tuple(args.dns), ip_addresses=tuple(args.ip), new_ca=args.new_ca
    )
    for path in paths:
        print(path)
    return 0


def _crds(args: argparse.Namespace) -> int:
    from berth.crds import write_crds

    for path in write_crds(args.out):
        print(path)
    return 0


def _add_registered(commands: Commands) -> None:
    """Add the sub-commands of the `berth.commands` entry point group: each names a
    function that adds its parser. One whose module is not installed is left out."""
    for entry in entry_points(group=REGISTERED):
        try:
            add_parser: Callable[[Commands], None] = entry.load()
        except ModuleNotFoundError as error:
            if error.name is None or not f"{entry.module}.".startswith(f"{error.name}."):
                raise  # its module is there but something it imports is missing: a bug
            continue
        add_parser(commands)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="berth", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    _add_registered(commands)

    certs = commands.add_parser("certs", help="make a self-signed CA and a serving certificate")
    certs.add_argument("--out", type=Path, required=True, help="directory for ca/tls files")
    certs.add_argument("--dns", action="append", default=[], help="a DNS name (repeatable)")
    certs.add_argument("--ip", action="append", default=[], help="an IP address (repeatable)")
    certs.add_argument(
        "--new-ca",
        action="store_true",
        help="make a new CA even if DIR holds one (by default a CA in DIR signs the new "
        "serving certificate: a renewal that changes no caBundle)",
    )
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
    except CONFIG_ERRORS as error:
        return bad_config(f"berth {args.command}", error)
    except (ValueError, OSError) as error:  # a bad value; a file that cannot be written
        print(f"berth: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
