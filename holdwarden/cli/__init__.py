"""The ``holdwarden`` command line: one entry point, a sub-command per task. The roof.

This package is the composition root: the only shipped code that imports more than one
part. It assembles the two long-running processes, ``holdwarden serve`` (the enforcer:
holdwarden/cli/serve.py, enforcer.py) and ``holdwarden gate`` (the readmission gate:
holdwarden/cli/gate.py, gateserver.py), and hands one part what it needs of another
(``certs`` verifies the enforcer with the adapter's preflight probe, given from here).
A part's own one-shot sub-commands live beside the part (``register(subparsers)``).
Exit codes: 0 success, 2 usage or configuration error, and for adapter calls the error's
``exit_code`` (see ``holdwarden.adapter.errors``).

The same program is the kubectl plugin ``kubectl-holdwarden`` (``kubectl holdwarden ...``:
kubectl runs any ``kubectl-NAME`` on PATH), and ``holdwarden completion bash|zsh|tcsh``
prints a shell completion script made by shtab from this parser (static: completing
runs no Python, so a tab press costs nothing).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from holdwarden import __version__

Handler = Callable[[argparse.Namespace], int]


class _DemoUnavailable:
    """``holdwarden demo`` where only the runtime parts are installed (the image, a wheel)."""

    @staticmethod
    def register(subparsers: argparse._SubParsersAction[Any]) -> None:
        parser = subparsers.add_parser(
            "demo", help="the whole story on a local control plane (needs a source checkout)"
        )
        parser.set_defaults(handler=_DemoUnavailable.explain)

    @staticmethod
    def explain(_: argparse.Namespace) -> int:
        print(
            "holdwarden demo: this installation has only the runtime parts (no local control "
            "plane); run it from a source checkout with `make demo`",
            file=sys.stderr,
        )
        return 2


def _register_completion(subparsers: argparse._SubParsersAction[Any], prog: str) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or tcsh)",
        description=(
            f"Print a completion script for {prog}. bash: "
            f"`source <({prog} completion bash)`, or save it under "
            "/etc/bash_completion.d/; zsh: save it as _holdwarden on your $fpath."
        ),
    )
    parser.add_argument("shell", choices=("bash", "zsh", "tcsh"), help="the shell")
    parser.set_defaults(handler=_print_completion)


def _print_completion(args: argparse.Namespace) -> int:
    import shtab

    parser = build_parser(args.prog_name)
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return 0


def build_parser(prog: str = "holdwarden") -> argparse.ArgumentParser:
    # Imported here so that `holdwarden --help` names every part's sub-commands while each
    # part keeps its CLI beside its code.
    from holdwarden.adapter import cli as adapter_cli
    from holdwarden.certs import cli as certs_cli
    from holdwarden.cli import gate, serve
    from holdwarden.webhook import cli as webhook_cli

    demo: Any
    try:
        # The demo runs a local control plane: development tooling, not in the wheel.
        from rig.localcluster import demo
    except ImportError:
        demo = _DemoUnavailable

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Instance-numbered holds for Kubeflow Trainer TrainJobs.",
    )
    parser.set_defaults(prog_name=prog)
    parser.add_argument("--version", action="version", version=f"holdwarden {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(subparsers)
    gate.register(subparsers)
    webhook_cli.register(subparsers)
    certs_cli.register(subparsers, verify=serve.verify_enforcer)
    for module in (adapter_cli, demo):
        module.register(subparsers)
    _register_completion(subparsers, prog)
    return parser


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-holdwarden``: the same commands, named as kubectl shows them."""
    return main(argv, prog="kubectl holdwarden")


def main(argv: Sequence[str] | None = None, prog: str = "holdwarden") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
