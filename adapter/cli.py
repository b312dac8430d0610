"""Operator sub-commands over the adapter.

``holdwarden hold|release|open|status NAMESPACE/NAME [--instance N] [--timeout 30s]
[--reason TEXT] [--preflight] [--config FILE] [--kubeconfig PATH]`` (hold and release check
only the right to update the held object, one access review, unless ``--preflight``) and
``holdwarden preflight [--namespace NS]``. Exit codes: 0 success; 2 usage or configuration
error; otherwise the adapter error's ``exit_code`` (3 rejected, 4 stale hold, 5 not found,
6 unsupported, 7 pods remain, 8 conflict, 9 unreachable: nothing was sent, 1 any other API
error).
``preflight`` exits 6 when Hold is unsupported.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from adapter.errors import AdapterError, Unsupported
from adapter.kube import Adapter
from adapter.types import CallMeta, Observation, PreflightResult, Ref
from holdwarden import kubeclient
from holdwarden.config import Config, ConfigError, parse_duration
from holdwarden.vocabulary import MAX_HOLD_INSTANCE, check_hold_instance

USAGE_ERROR = 2


def _ref(text: str) -> Ref:
    try:
        return Ref.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


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


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="holdwarden YAML configuration")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (default: in-cluster)")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    calls = {
        "hold": "place hold instance N (Kueue mode: deactivate the Workload)",
        "release": "lift hold instance N (refused unless N is the hold in force)",
        "open": "open the TrainJob (plain mode: run it if it waits at its start gate)",
        "status": "observe the TrainJob: held, deactivated, at its start gate, running, ...",
    }
    for name, help_text in calls.items():
        p = subparsers.add_parser(name, help=help_text, description=help_text)
        p.add_argument("ref", type=_ref, metavar="NAMESPACE/NAME", help="the TrainJob")
        if name in ("hold", "release"):
            p.add_argument("--instance", type=_instance, required=True, metavar="N")
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
            p.add_argument("--reason", default="operator hold", metavar="TEXT")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print the Observation as JSON")
        _common(p)
        p.set_defaults(handler=_run_call, call=name)
    pre = subparsers.add_parser(
        "preflight",
        help="probe what the adapter can do: hold round trip, RBAC, enforcer",
        description="Probe the hold round trip, RBAC and whether the enforcer is installed.",
    )
    pre.add_argument("--namespace", default="default", metavar="NS")
    pre.add_argument("--json", action="store_true", help="print the result as JSON")
    _common(pre)
    pre.set_defaults(handler=_run_preflight)


def _adapter(args: argparse.Namespace) -> Adapter:
    """Build the adapter; raises ConfigError (or the kube config loader's errors).

    hold and release check only the right to update the held object (an access review)
    unless ``--preflight``: an operator needs no create right just to hold, and the
    dry-run creates cost two writes' worth of admission on every command."""
    config = Config.from_file(args.config) if args.config else Config()
    api = kubeclient.api_client(args.kubeconfig) if args.kubeconfig else None
    lazy: Literal["full", "access"] = "full" if getattr(args, "preflight", False) else "access"
    try:
        return Adapter(config, api, lazy_preflight=lazy)
    finally:
        if api is not None:
            api.close()  # type: ignore[no-untyped-call]  # the adapter made its own copy


def _setup(args: argparse.Namespace) -> Adapter | None:
    try:
        return _adapter(args)
    except ConfigError as exc:
        print(f"holdwarden: configuration error: {exc}", file=sys.stderr)
    except Exception as exc:  # the kube config loader raises several unrelated types
        print(f"holdwarden: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
    return None


def _print_observation(obs: Observation, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obs.to_dict(), indent=2, sort_keys=True))
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


def _run_call(args: argparse.Namespace) -> int:
    adapter = _setup(args)
    if adapter is None:
        return USAGE_ERROR
    ref: Ref = args.ref
    call: str = args.call
    try:
        if call == "status":
            _print_observation(adapter.observe(ref), args.json)
            return 0
        meta = CallMeta(datetime.now(UTC) + args.timeout, getattr(args, "instance", None))
        if call == "hold":
            adapter.hold(ref, meta, args.reason)
            print(f"held {ref} (instance {args.instance})")
        elif call == "release":
            adapter.release(ref, meta)
            print(f"released {ref} (instance {args.instance})")
        else:
            adapter.open(ref, meta)
            print(f"opened {ref}")
        return 0
    except AdapterError as exc:
        print(f"holdwarden {call}: {exc.classification}: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        adapter.close()


def _print_preflight(result: PreflightResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return
    print(f"mode {result.mode}, namespace {result.namespace}")
    for name, cap in result.capabilities().items():
        print(f"  {name:<18} {'yes' if cap.supported else 'NO ':<4} {cap.reason}")
    gate = result.extra.get("readmissionGate")
    if gate is not None and not gate.supported:
        print(f"warning: readmission gate: {gate.reason}")
    if result.hold_supported:
        print("hold: supported")
    else:
        print(f"hold: UNSUPPORTED: {result.hold_unsupported_reason}")


def _run_preflight(args: argparse.Namespace) -> int:
    adapter = _setup(args)
    if adapter is None:
        return USAGE_ERROR
    try:
        result = adapter.preflight(args.namespace)
    except AdapterError as exc:
        print(f"holdwarden preflight: {exc.classification}: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        adapter.close()
    _print_preflight(result, args.json)
    return 0 if result.hold_supported else Unsupported.exit_code
