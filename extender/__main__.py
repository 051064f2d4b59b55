"""`python -m extender ARGS` is `berth extender ARGS`."""

import argparse
import sys

from extender.cli import add_parser


def main() -> int:
    root = argparse.ArgumentParser(prog="python -m extender")
    add_parser(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(["extender", *sys.argv[1:]])
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
