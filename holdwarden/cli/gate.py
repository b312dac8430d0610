"""``holdwarden gate``: the readmission gate (readmission/) as its own process.

A Kueue AdmissionCheck controller (docs/explanation/readmission-gate.md), in its own
Deployment beside the enforcer's (manifests/readmission, the chart's
``readmission.enabled``), so that its re-lists of every job pod never share an event loop
or a GIL with admission reviews. Its replicas campaign for the Lease
``readmission.leaseName``; the holder writes, the others keep warm caches. The process
serves GET /metrics, /healthz and /readyz on ``readmission.metricsAddress``
(holdwarden/cli/gateserver.py). Logs are JSON lines (holdwarden/cli/logs.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

import msgspec

from holdwarden.cli.logs import add_log_level_argument, configure_logging, flush_logs
from holdwarden.cli.serve import check_address
from holdwarden.config import Config, ConfigError
from holdwarden.kubeclient import PRECEDENCE_HELP


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    gate = subparsers.add_parser(
        "gate",
        help="run the readmission gate (a Kueue AdmissionCheck controller), with metrics and "
        "health endpoints",
        description="Run the readmission gate: set the Workloads' AdmissionCheck Ready only "
        "when the TrainJob is opened, no hold is in force and no pod of the previous "
        "execution remains (docs/explanation/readmission-gate.md).",
    )
    gate.add_argument("--config", metavar="FILE", help="holdwarden YAML configuration")
    gate.add_argument(
        "--metrics",
        metavar="ADDR",
        help="metrics/health address, host:port (readmission.metricsAddress)",
    )
    gate.add_argument(
        "--kubeconfig", metavar="PATH", help=f"kubeconfig file; default: {PRECEDENCE_HELP}"
    )
    gate.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    add_log_level_argument(gate)
    gate.set_defaults(handler=gate_command)


def gate_command(args: argparse.Namespace) -> int:
    try:
        config = Config.from_file(args.config) if args.config else Config()
        if args.metrics:
            address = check_address(args.metrics, "--metrics")
            config = msgspec.structs.replace(
                config,
                readmission=msgspec.structs.replace(config.readmission, metrics_address=address),
            )
    except ConfigError as exc:
        print(f"holdwarden gate: {exc}", file=sys.stderr)
        return 2
    configure_logging(getattr(logging, args.log_level.upper()))
    from holdwarden.cli.gateserver import run_gate
    from holdwarden.kubeclient import KubeconfigError, api_client

    log = logging.getLogger("holdwarden.readmission")
    try:
        api = api_client(args.kubeconfig, args.context)
    except KubeconfigError as exc:
        log.error("cannot run the gate", extra={"fields": {"error": str(exc)}})
        flush_logs()
        return 1
    try:
        asyncio.run(run_gate(config, api))
    except OSError as exc:
        log.error("cannot run the gate", extra={"fields": {"error": str(exc)}})
        return 1
    finally:
        api.close()  # type: ignore[no-untyped-call]
        flush_logs()  # the last lines are on stderr when the command returns
    return 0
