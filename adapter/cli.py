"""Operator sub-commands over the adapter, with kubectl's conventions.

``holdwarden hold|release|open|status [NAMESPACE/]NAME [-n NS] [--instance N] [--timeout 30s]
[--reason TEXT] [--preflight] [-o json|yaml|wide] [--config FILE] [--kubeconfig PATH]
[--context NAME]`` (hold and release check only the right to write the held object, one
access review, unless ``--preflight``) and ``holdwarden preflight [-n NS] [-o ...]``.
A bare NAME is in ``-n``'s namespace, else the kubeconfig context's, else ``default``.
Credentials: holdwarden.kubeclient (kubectl's precedence). Exit codes: see ``EXIT_CODES``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import yaml

from holdwarden import kubeclient
from holdwarden.adapter import traps
from holdwarden.adapter.errors import (
    AdapterError,
    DeadlinePassed,
    NotFound,
    Rejected,
    RuntimeMissing,
    StaleHold,
    Unreachable,
    Unsupported,
)
from holdwarden.adapter.kube import Adapter
from holdwarden.adapter.preflight import TRAP_CAPABILITIES
from holdwarden.adapter.types import CallMeta, Observation, PreflightResult, Ref
from holdwarden.config import Config, ConfigError, parse_duration
from holdwarden.vocabulary import MAX_HOLD_INSTANCE, check_hold_instance

USAGE_ERROR = 2

EXIT_CODES = (
    "exit codes: 0 done; 1 other API error; 2 usage, configuration or credentials error "
    "(a bad --kubeconfig is named); 3 refused (by RBAC, the enforcer or the deadline); "
    "4 stale hold; 5 not found; 6 unsupported; 7 pods remain; 8 conflict; 9 unreachable "
    "(no connection: nothing was sent); 10 the TrainJob's runtime is missing"
)


def _ref_text(text: str) -> str:
    """``NAMESPACE/NAME`` or ``NAME``; checked now, resolved once ``-n`` is known."""
    try:
        Ref.parse(text if "/" in text else f"default/{text}")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAMESPACE/NAME or NAME (with -n NAMESPACE), "
            "e.g. 'team-a/llm-finetune'"
        ) from None
    return text


def _resolve_ref(args: argparse.Namespace) -> Ref | None:
    """The TrainJob named on the command line, kubectl-style; None (after saying why) when
    the positional's namespace and ``-n`` disagree."""
    text: str = args.ref
    if "/" in text:
        ref = Ref.parse(text)
        if args.namespace is not None and args.namespace != ref.namespace:
            print(
                f"holdwarden {args.call}: {text} names namespace {ref.namespace}, but "
                f"-n says {args.namespace}; give one",
                file=sys.stderr,
            )
            return None
        return ref
    namespace = args.namespace or kubeclient.default_namespace(args.kubeconfig, args.context)
    return Ref.parse(f"{namespace}/{text}")


def error_label(exc: AdapterError) -> str:
    """What went wrong, in the words an operator branches on: not found, refused and
    unreachable are distinct (and so are their exit codes)."""
    if isinstance(exc, NotFound):
        return "not found"
    if isinstance(exc, StaleHold):
        return "rejected (stale hold)"
    if isinstance(exc, DeadlinePassed):
        return "rejected (deadline passed)"
    if isinstance(exc, RuntimeMissing):
        return "refused (runtime missing)"
    if isinstance(exc, Rejected):
        return "refused"
    if isinstance(exc, Unreachable):
        return "unreachable"
    return exc.classification


def _instance(text: str) -> int:
    """A decimal hold instance within the shared bound (vocabulary.MAX_HOLD_INSTANCE)."""
    try:
        return check_hold_instance(int(text) if text.isdigit() else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a hold instance, an integer in [1, {MAX_HOLD_INSTANCE}]"
        ) from None


def _timeout(text: str) -> timedelta:
    try:
        value = parse_duration(text, "--timeout")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError("--timeout must be longer than zero")
    return value


def cluster_flags(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--context``, as kubectl has them."""
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help=f"kubeconfig file; default: {kubeclient.PRECEDENCE_HELP}",
    )
    parser.add_argument(
        "--context", metavar="NAME", help="kubeconfig context to use (default: its current-context)"
    )


def output_flags(parser: argparse.ArgumentParser) -> None:
    """``-o json|yaml|wide``, and the older ``--json`` (the same as ``-o json``)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=("json", "yaml", "wide"),
        help="output format: json, yaml, or wide (a table with every field); default: text",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="same as -o json"
    )


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="holdwarden YAML configuration (default: built-in defaults)",
    )
    cluster_flags(parser)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    calls = {
        "hold": "place hold instance N (Kueue mode: deactivate the Workload)",
        "release": "lift hold instance N (refused unless N is the hold in force)",
        "open": "open the TrainJob (plain mode: run it if it waits at its start gate)",
        "status": "observe the TrainJob: held, deactivated, at its start gate, running, ...",
    }
    for name, help_text in calls.items():
        p = subparsers.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES)
        p.add_argument(
            "ref",
            type=_ref_text,
            metavar="[NAMESPACE/]NAME",
            help="the TrainJob; a bare NAME is in -n's namespace (default: the context's)",
        )
        p.add_argument(
            "-n",
            "--namespace",
            metavar="NS",
            help="the TrainJob's namespace (default: the kubeconfig context's, else default)",
        )
        if name in ("hold", "release"):
            p.add_argument(
                "--instance",
                type=_instance,
                required=True,
                metavar="N",
                help=(
                    "the hold instance, an integer >= 1: hold places N (greater than any "
                    "before it), release lifts N (refused unless N is the hold in force)"
                ),
            )
            p.add_argument(
                "--preflight",
                action="store_true",
                help="run the full preflight first (dry-run creates: needs create rights); "
                "default: one access review of the right to update the held object",
            )
        if name != "status":
            p.add_argument(
                "--timeout",
                type=_timeout,
                default=timedelta(seconds=30),
                metavar="DURATION",
                help="the call's deadline from now, e.g. 30s (default 30s)",
            )
        if name == "hold":
            p.add_argument(
                "--reason",
                default="operator hold",
                metavar="TEXT",
                help="why, recorded in the hold-reason annotation (default: operator hold)",
            )
        if name == "status":
            output_flags(p)
        _common(p)
        p.set_defaults(handler=_run_call, call=name)
    pre = subparsers.add_parser(
        "preflight",
        help="probe what the adapter can do: hold round trip, RBAC, enforcer",
        description="Probe the hold round trip, RBAC and whether the enforcer is installed.",
        epilog=EXIT_CODES + "; preflight exits 6 when Hold is unsupported",
    )
    pre.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace to probe (default: the kubeconfig context's, else default)",
    )
    output_flags(pre)
    _common(pre)
    pre.set_defaults(handler=_run_preflight)


def _adapter(args: argparse.Namespace) -> Adapter:
    """Build the adapter; raises ConfigError (or the kube config loader's errors).

    hold and release check only the right to update the held object (an access review)
    unless ``--preflight``: an operator needs no create right just to hold, and the
    dry-run creates cost two writes' worth of admission on every command."""
    config = Config.from_file(args.config) if args.config else Config()
    api = kubeclient.api_client(args.kubeconfig, args.context)
    lazy: Literal["full", "access"] = "full" if getattr(args, "preflight", False) else "access"
    try:
        return Adapter(config, api, lazy_preflight=lazy)
    finally:
        api.close()  # type: ignore[no-untyped-call]  # the adapter made its own copy


def _setup(args: argparse.Namespace) -> Adapter | None:
    try:
        return _adapter(args)
    except ConfigError as exc:
        print(f"holdwarden: configuration error: {exc}", file=sys.stderr)
    except kubeclient.KubeconfigError as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
    except Exception as exc:  # the kube config loader raises several unrelated types
        print(f"holdwarden: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
    return None


def print_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> None:
    """kubectl-style columns: upper-case header, cells padded, ``-`` for nothing."""
    cells = [[("-" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
              for v in row] for row in rows]  # fmt: skip
    widths = [max(len(r[i]) for r in [list(header), *cells]) for i in range(len(header))]
    for row in [list(header), *cells]:
        print("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _print_data(data: dict[str, object], output: str) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump(data, sort_keys=True, default_flow_style=False), end="")


def _print_observation(obs: Observation, output: str | None) -> None:
    if output in ("json", "yaml"):
        _print_data(obs.to_dict(), output)
        return
    if output == "wide":
        data = obs.to_dict()
        keys = ["ref", "state", *sorted(k for k in data if k not in ("ref", "state"))]
        print_table([[data[k] if not isinstance(data[k], list) else ",".join(map(str, data[k]))
                      or None for k in keys]], [k.upper() for k in keys])  # fmt: skip
        return
    print(f"{obs.ref}: {obs.state.value}")
    for key, value in obs.to_dict().items():
        if key not in ("ref", "state") and value is not None:
            print(f"  {key}: {value}")
    if obs.leftover_pods:
        print(
            f"warning: {len(obs.leftover_pods)} pod(s) of a previous execution remain: "
            f"{', '.join(obs.leftover_pods)}"
        )
    if obs.ungated_admission:
        print(
            f"warning: Workload {obs.workload} was admitted with no AdmissionCheck, so the "
            "readmission gate did not decide this execution: its pods may request no "
            "resources (Kueue applies flavor-scoped checks only to a Workload given a flavor), "
            "or its ClusterQueue lists no check (holdwarden preflight says which)"
        )
    if obs.stranded and obs.workload is not None and obs.kueue_requeue_blocked is not None:
        print(
            "warning: "
            + traps.stranded_advice(obs.ref.namespace, obs.workload, obs.kueue_requeue_blocked)
        )


def _run_call(args: argparse.Namespace) -> int:
    adapter = _setup(args)
    if adapter is None:
        return USAGE_ERROR
    call: str = args.call
    try:
        ref = _resolve_ref(args)
        if ref is None:
            return USAGE_ERROR
        if call == "status":
            _print_observation(adapter.observe(ref), args.output)
            return 0
        meta = CallMeta(datetime.now(UTC) + args.timeout, getattr(args, "instance", None))
        if call == "hold":
            adapter.hold(ref, meta, args.reason)
            print(f"held {ref} (instance {args.instance})")
        elif call == "release":
            released = adapter.release(ref, meta)
            print(f"released {ref} (instance {args.instance})")
            for warning in released.warnings:
                print(f"warning: {warning}", file=sys.stderr)
        else:
            adapter.open(ref, meta)
            print(f"opened {ref}")
        return 0
    except AdapterError as exc:
        print(f"holdwarden {call}: {error_label(exc)}: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        adapter.close()


def _print_preflight(result: PreflightResult, output: str | None) -> None:
    if output in ("json", "yaml"):
        _print_data(result.to_dict(), output)
        return
    if output == "wide":
        print_table(
            [[result.mode, result.namespace, name, cap.supported, cap.reason]
             for name, cap in result.capabilities().items()],
            ["MODE", "NAMESPACE", "CAPABILITY", "SUPPORTED", "REASON"],
        )  # fmt: skip
        return
    print(f"mode {result.mode}, namespace {result.namespace}")
    for name, cap in result.capabilities().items():
        print(f"  {name:<18} {'yes' if cap.supported else 'NO ':<4} {cap.reason}")
    gate = result.extra.get("readmissionGate")
    if gate is not None and not gate.supported:
        print(f"warning: readmission gate: {gate.reason}")
    for name in TRAP_CAPABILITIES:
        trap = result.extra.get(name)
        if trap is not None and not trap.supported:
            print(f"warning: {name}: {trap.reason}")
    if result.hold_supported:
        print("hold: supported")
    else:
        print(f"hold: UNSUPPORTED: {result.hold_unsupported_reason}")


def _run_preflight(args: argparse.Namespace) -> int:
    adapter = _setup(args)
    if adapter is None:
        return USAGE_ERROR
    namespace = args.namespace or kubeclient.default_namespace(args.kubeconfig, args.context)
    try:
        result = adapter.preflight(namespace)
    except AdapterError as exc:
        print(f"holdwarden preflight: {error_label(exc)}: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        adapter.close()
    _print_preflight(result, args.output)
    return 0 if result.hold_supported else Unsupported.exit_code
