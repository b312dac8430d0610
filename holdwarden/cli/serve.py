"""``holdwarden serve``: the enforcer's process, assembled from its parts.

The admission app (webhook/server.py: the handler, the apps; webhook/audit*.py, the audit
trail; webhook/connections.py, the transport limits) is served on the TLS port, with the
metrics app on its own port (the process: holdwarden/cli/enforcer.py). Its certificates
come from certs/: files reloaded on change, or self-managed through the API, whose leader
verifies the enforcer with the adapter's preflight probe before it sets ``failurePolicy:
Fail`` (``verify_enforcer``, handed to certs/ from here). Logs are JSON lines
(holdwarden/cli/logs.py). SIGTERM drains, SIGHUP reopens the audit log.

The readmission gate is not part of this process: ``holdwarden gate``
(holdwarden/cli/gate.py), its own Deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from holdwarden.cli.logs import add_log_level_argument, configure_logging, flush_logs
from holdwarden.config import AUDIT_SINKS, CERT_MODES, Config, ConfigError, check_audit_sinks

if TYPE_CHECKING:
    from kubernetes import client as k8s


def verify_enforcer(config: Config, api: k8s.ApiClient, namespace: str) -> tuple[bool, str]:
    """Does the enforcer answer through the apiserver? The adapter's preflight probe (a
    server-side dry-run create of a held object without its hold field, which the enforcer
    must refuse by its rule; adapter/preflight.py), in ``namespace``. (True, why) or (False,
    why). Handed to certs/enforcing.py, so that certs/ does not import the adapter.
    """
    from holdwarden.adapter.kube import Adapter  # loaded only to verify

    with Adapter(config, api) as adapter:
        found = adapter.preflight(namespace).enforcer_installed
    return found.supported, found.reason


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the admission enforcer (TLS), with metrics and health endpoints",
        description="Run the validating admission webhook that refuses hold-breaking writes.",
    )
    serve.add_argument("--config", metavar="FILE", help="holdwarden YAML configuration")
    serve.add_argument("--listen", metavar="ADDR", help="admission address, host:port")
    serve.add_argument("--cert-dir", metavar="DIR", help="directory with tls.crt and tls.key")
    serve.add_argument(
        "--certificates",
        choices=CERT_MODES,
        help="webhook.certificates.mode: files (from --cert-dir) or self-managed (a CA and "
        "serving certificate this server keeps in a Secret; "
        "docs/explanation/self-managed-certificates.md)",
    )
    serve.add_argument("--audit-log", metavar="PATH", help="audit log file (JSON lines)")
    serve.add_argument("--metrics", metavar="ADDR", help="metrics/health address, host:port")
    serve.add_argument(
        "--audit-sink",
        action="append",
        choices=AUDIT_SINKS,
        metavar="SINK",
        help="where refusals are recorded: file, stdout or events; repeat it for several "
        "(duplicates fold). Given, it replaces webhook.auditSinks",
    )
    add_log_level_argument(serve)
    serve.set_defaults(handler=serve_command)


def check_address(value: str, flag: str) -> str:
    """``host:port`` with a port in 0..65535 (0 binds a free port)."""
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(flag, f"{value!r} is not host:port, e.g. '0.0.0.0:9443'")
    return value


def _load_config(path: str | None) -> Config:
    return Config.from_file(path) if path else Config()


def serve_command(args: argparse.Namespace) -> int:
    try:
        config = _load_config(args.config)
        hook = config.webhook
        changes: dict[str, Any] = {}
        if args.listen:
            changes["listen_address"] = check_address(args.listen, "--listen")
        if args.metrics:
            changes["metrics_address"] = check_address(args.metrics, "--metrics")
        if args.cert_dir:
            changes["cert_dir"] = Path(args.cert_dir)
        if args.certificates:
            changes["certificates"] = msgspec.structs.replace(
                hook.certificates, mode=args.certificates
            )
        if args.audit_log:
            changes["audit_log"] = Path(args.audit_log)
        if args.audit_sink:
            # Set semantics, so that overlays can each add the sinks they need.
            changes["audit_sinks"] = check_audit_sinks(
                list(dict.fromkeys(args.audit_sink)), "--audit-sink"
            )
        config = msgspec.structs.replace(config, webhook=msgspec.structs.replace(hook, **changes))
    except ConfigError as exc:
        print(f"holdwarden serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(getattr(logging, args.log_level.upper()))
    from holdwarden.kubeclient import KubeconfigError

    try:
        from holdwarden.cli.enforcer import event_loop_factory, run_server

        with asyncio.Runner(loop_factory=event_loop_factory(config.webhook.event_loop)) as runner:
            runner.run(run_server(config))
    except (OSError, KubeconfigError) as exc:
        logging.getLogger("holdwarden.webhook").error(
            "cannot serve", extra={"fields": {"error": str(exc)}}
        )
        return 1
    finally:
        flush_logs()  # the last lines are on stderr when the command returns
    return 0
