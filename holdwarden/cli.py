"""The ``holdwarden`` command line: one entry point, a sub-command per task.

Each part registers its own sub-commands (``register(subparsers)``) so that the CLI of a
part lives beside the part. Exit codes: 0 success, 2 usage or configuration error, and
for adapter calls the error's ``exit_code`` (see ``adapter.errors``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from holdwarden import __version__

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    # Imported here so that `holdwarden --help` names every part's sub-commands while each
    # part keeps its CLI beside its code.
    from adapter import cli as adapter_cli
    from certs import cli as certs_cli
    from holdwarden import demo
    from webhook import cli as webhook_cli

    parser = argparse.ArgumentParser(
        prog="holdwarden",
        description="Instance-numbered holds for Kubeflow Trainer TrainJobs.",
    )
    parser.add_argument("--version", action="version", version=f"holdwarden {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (webhook_cli, certs_cli, adapter_cli, demo):
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
