"""``holdwarden audit``: query the enforcer's audit log (``holdwarden serve``, the process,
is assembled by the roof: holdwarden/cli/serve.py)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from holdwarden.config import (
    Config,
    ConfigError,
    parse_duration,
)
from holdwarden.kubeclient import PRECEDENCE_HELP
from holdwarden.vocabulary import RuleId


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    audit = subparsers.add_parser(
        "audit",
        help="list the enforcer's refusals from its audit log",
        description="Print refusals from the enforcer's audit log (its rotated files "
        "PATH.1, PATH.2, ... included), newest last.",
    )
    audit.add_argument("--config", metavar="FILE", help="configuration naming the audit log")
    audit.add_argument(
        "--log",
        metavar="PATH",
        help="audit log file (overrides the config); - reads audit lines from standard "
        "input, e.g. `kubectl exec POD -- cat /var/log/holdwarden/audit.jsonl | holdwarden "
        "audit --log -` (lines that are not JSON objects are skipped and counted)",
    )
    audit.add_argument(
        "--from-cluster",
        action="store_true",
        help="read the Events the enforcer's events sink wrote (label holdwarden.io/audit="
        "refusal) instead of a log; with -n only that namespace's, else every namespace's",
    )
    audit.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help=f"with --from-cluster: kubeconfig file; default: {PRECEDENCE_HELP}",
    )
    audit.add_argument(
        "--context", metavar="NAME", help="with --from-cluster: kubeconfig context to use"
    )
    audit.add_argument("--namespace", "-n", metavar="NS", help="only refusals in this namespace")
    audit.add_argument("--name", help="only refusals of objects with this name")
    audit.add_argument("--user", help="only refusals of writes by this user")
    audit.add_argument(
        "--rule", choices=[str(rule) for rule in RuleId], help="only refusals by this rule"
    )
    audit.add_argument("--since", help="a duration such as 10m or 2h, or an RFC 3339 time")
    audit.add_argument(
        "-o",
        "--output",
        choices=("json", "yaml", "wide"),
        help="json (one JSON object a line), yaml (one document a refusal) or wide (a table "
        "with every field); default: a table",
    )
    audit.add_argument(
        "--json", dest="output", action="store_const", const="json", help="same as -o json"
    )
    audit.set_defaults(handler=audit_command)


def _load_config(path: str | None) -> Config:
    return Config.from_file(path) if path else Config()


def parse_since(text: str, now: datetime) -> datetime:
    """``10m``-style durations count back from ``now``; otherwise an RFC 3339 time."""
    try:
        return now - parse_duration(text, "--since")
    except ConfigError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            "--since", f"{text!r} is neither a duration (10m, 2h) nor an RFC 3339 time"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


_COLUMNS = ("time", "rule", "namespace", "name", "instance", "user", "operation", "dryRun")


def print_table(
    records: list[dict[str, Any]], out: TextIO, columns: tuple[str, ...] = _COLUMNS
) -> None:
    rows = [[_cell(record.get(column)) for column in columns] for record in records]
    header = [column.upper() for column in columns]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(columns))]
    for row in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write(line.rstrip() + "\n")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def audit_command(args: argparse.Namespace) -> int:
    from holdwarden.webhook.audit import AuditFilter, read_audit, read_audit_stream

    try:
        config = _load_config(args.config)
        since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    except ConfigError as exc:
        print(f"holdwarden audit: {exc}", file=sys.stderr)
        return 2
    path = Path(args.log) if args.log else config.webhook.audit_log
    wanted = AuditFilter(args.namespace, args.name, args.user, args.rule, since)
    if args.from_cluster:
        if args.log:
            print("holdwarden audit: --from-cluster reads Events, not --log", file=sys.stderr)
            return 2
        return _audit_from_cluster(args, config, wanted)
    try:
        if args.log == "-":
            result = read_audit_stream(sys.stdin.buffer, wanted)
        else:
            result = read_audit(
                path,
                namespace=wanted.namespace,
                name=wanted.name,
                user=wanted.user,
                rule=wanted.rule,
                since=wanted.since,
            )
    except OSError as exc:
        print(f"holdwarden audit: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 1
    if not result.files:
        # A missing log must not read as "no refusals".
        where = "--log" if args.log else f"webhook.auditLog (from {args.config or 'defaults'})"
        print(
            f"holdwarden audit: no audit log at {path} (nor rotated files {path}.1, ...); "
            f"check {where}. The enforcer creates it at start-up; in a cluster each Pod keeps "
            "its own (docs/explanation/audit-trail.md).",
            file=sys.stderr,
        )
        return 1
    _print_records(result.records, args.output)
    if result.skipped:
        # file:line, since the log spans the current file and its rotated ones.
        where = ", ".join(f"{source.name}:{n}" for source, n in result.skipped_at[:10])
        print(
            f"holdwarden audit: skipped {result.skipped} unreadable line(s) in {path} "
            f"and its rotated files ({where}); a torn last line is expected after a crash",
            file=sys.stderr,
        )
    return 0


def _print_records(
    records: list[dict[str, Any]], output: str | None, columns: tuple[str, ...] = _COLUMNS
) -> None:
    if output == "json":
        for record in records:
            sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    elif output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump_all(records, sort_keys=True) if records else "")
    elif output == "wide":
        # Every field any record has, the usual columns first.
        extra = sorted({key for record in records for key in record} - set(columns))
        print_table(records, sys.stdout, (*columns, *extra))
    else:
        print_table(records, sys.stdout, columns)


# The Events' table: a row stands for COUNT identical refusals, TIME the last of them.
_CLUSTER_COLUMNS = ("time", "count", "rule", "namespace", "name", "instance", "user", "operation")


def _audit_from_cluster(args: argparse.Namespace, config: Config, wanted: Any) -> int:
    """``audit --from-cluster``: the enforcer's Events, filtered, in the same table."""
    from kubernetes.client.exceptions import ApiException

    from holdwarden import kubeclient
    from holdwarden.webhook.audit_sinks import EventLabels, read_cluster_events

    try:
        api = kubeclient.api_client(args.kubeconfig, args.context)
    except kubeclient.KubeconfigError as exc:
        print(f"holdwarden audit: {exc}", file=sys.stderr)
        return 2
    timeout = config.apiserver_request_timeout.total_seconds()
    try:
        records = read_cluster_events(
            api, EventLabels(config.annotation_prefix), namespace=args.namespace, timeout=timeout
        )
    except ApiException as exc:
        where = f"namespace {args.namespace}" if args.namespace else "all namespaces"
        print(
            f"holdwarden audit: cannot list events.k8s.io Events in {where}: {exc.status} "
            f"{exc.reason} (holdwarden-operator-view grants list on them)",
            file=sys.stderr,
        )
        return 3 if exc.status in (401, 403) else 1
    except Exception as exc:  # urllib3's connection and timeout errors
        print(f"holdwarden audit: cannot reach the cluster: {exc}", file=sys.stderr)
        return 9
    finally:
        api.close()  # type: ignore[no-untyped-call]
    _print_records([r for r in records if wanted.matches(r)], args.output, _CLUSTER_COLUMNS)
    return 0
