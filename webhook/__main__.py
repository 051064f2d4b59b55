"""`python -m webhook ARGS` is `berth webhook ARGS`."""

import argparse
import sys

from webhook.cli import add_parser


def main() -> int:
    root = argparse.ArgumentParser(prog="python -m webhook")
    add_parser(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(["webhook", *sys.argv[1:]])
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
