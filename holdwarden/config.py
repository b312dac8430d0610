"""The configuration schema: one YAML file, camelCase keys, durations such as ``60s``.

The schema is the msgspec Structs below and nothing else: each key, its type, its bounds,
its default and its meaning are stated once, in its field. ``docs/configuration.md``'s
table and the chart's ``values.schema.json`` are generated from them
(``python -m rig.configschema``), and a test checks they are up to date.

Invariants: a ``Config`` read by ``from_dict``/``from_file`` holds only validated values;
unknown keys and bad values raise ``ConfigError`` naming the offending key by its dotted
path (``kueue.managedJobsNamespaceSelector.matchLabels``). The Python attribute path is
the key's path in snake_case (``webhook.auditEvents.queueSize`` is
``config.webhook.audit_events.queue_size``). Objects built in code are not checked: the
checks are for what people write.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias, get_args

import msgspec
import yaml
from msgspec import Meta, field
from msgspec import inspect as mi

from holdwarden import labelselector
from holdwarden.labelselector import LabelSelector
from holdwarden.vocabulary import (
    DEFAULT_ANNOTATION_PREFIX,
    DEFAULT_KUEUE_IDENTITIES,
    DEFAULT_WORKLOAD_DELETERS,
    Mode,
)

DOCS = "docs/configuration.md"

_DURATION_RE = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
# The same language for JSON Schema readers (Go's RE2 in helm: no lookahead; an empty
# string matches it, which parse_duration refuses).
DURATION_PATTERN: Final = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$"

# Patterns a string key must match, and the words that tell the writer what to write
# instead. RE2-compatible and anchored: helm checks them too (values.schema.json).
_DNS_LABEL = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_FORMS: Final = {
    f"^{_DNS_LABEL}$": "a DNS label (lower-case letters, digits, '-'), e.g. 'holdwarden'",
    f"^{_DNS_LABEL}(\\.{_DNS_LABEL})*$": "a DNS name (DNS labels joined by '.')",
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$": (
        "a DNS subdomain such as 'holdwarden.io'"
    ),
    "^.*:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$": (
        "host:port, e.g. '0.0.0.0:9443'"
    ),
}
_DNS_LABEL_PATTERN, _DNS_NAME_PATTERN, _PREFIX_PATTERN, _ADDRESS_PATTERN = _FORMS

NonEmpty = Annotated[str, Meta(min_length=1)]
DnsLabel = Annotated[str, Meta(pattern=_DNS_LABEL_PATTERN)]
Address = Annotated[str, Meta(pattern=_ADDRESS_PATTERN)]
Identities = tuple[NonEmpty, ...]
CertMode = Literal["files", "self-managed"]
CERT_MODES: Final = get_args(CertMode)
AuditSink = Literal["file", "stdout", "events"]
AUDIT_SINKS: Final = get_args(AuditSink)
EventLoop = Literal["uvloop", "asyncio"]
EVENT_LOOPS: Final = get_args(EventLoop)


class ConfigError(ValueError):
    """A configuration value is unknown or invalid; ``key`` is its dotted path."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"config key {key!r}: {problem}")


class _DurationText(timedelta):
    """Marks a field msgspec hands to ``_decode``: a timedelta the file writes as ``1m30s``
    (msgspec itself would read ISO 8601, ``PT1M30S``). ``text`` is how it was written, so
    that it is written back (and documented) the same way."""

    text: str = ""


class _PositiveDurationText(_DurationText):
    """A duration that must be longer than zero."""


# For type checkers a duration is any timedelta (code builds configs with plain ones);
# only msgspec needs the marking classes.
if TYPE_CHECKING:
    Duration: TypeAlias = timedelta
    PositiveDuration: TypeAlias = timedelta
else:
    Duration = _DurationText
    PositiveDuration = _PositiveDurationText


def parse_duration(text: str, key: str = "duration") -> timedelta:
    """Parse a Kubernetes-style duration such as ``60s``, ``1m30s``, ``250ms`` or ``2h``."""
    match = _DURATION_RE.fullmatch(text) if isinstance(text, str) and text else None
    if match is None:
        raise ConfigError(
            key, f"{text!r} is not a duration; write it like '60s', '1m30s' or '250ms'"
        )
    hours, minutes, seconds, millis = (int(g) if g else 0 for g in match.groups())
    value = _DurationText(hours=hours, minutes=minutes, seconds=seconds, milliseconds=millis)
    value.text = text
    return value


def _as(kind: type[_DurationText], value: timedelta, text: str) -> _DurationText:
    out = kind(days=value.days, seconds=value.seconds, microseconds=value.microseconds)
    out.text = text
    return out


def format_duration(value: timedelta) -> str:
    """Duration text ``parse_duration`` reads back as ``value`` (whole ms): as it was
    written, if it was read from text, else the shortest."""
    if isinstance(value, _DurationText) and value.text:
        return value.text
    millis = round(value.total_seconds() * 1000)
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _default(text: str) -> Any:
    """A duration field's default, written as in the file."""
    value = parse_duration(text)
    return field(default_factory=lambda: value)


def _path(text: str) -> Any:
    return field(default_factory=lambda: Path(text))


def _doc(text: str, **constraints: Any) -> Meta:
    return Meta(description=text, **constraints)


# Every section: camelCase keys, unknown keys refused, immutable (mypy needs frozen=True
# repeated on each subclass).
class _Section(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    pass


class TimeoutsConfig(_Section, frozen=True):
    """Timeouts of calls to the apiserver."""

    apiserver_request: Annotated[
        PositiveDuration,
        _doc(
            "the apiserver's `--request-timeout` (set it to it: a request already on the "
            "wire can commit up to this long after its caller gave up); the adapter's "
            "`call_bound` is this plus 5 s"
        ),
    ] = _default("60s")


class KueueConfig(_Section, frozen=True):
    """How Kueue is configured, as holdwarden must know it (docs/configuration.md)."""

    identities: Annotated[
        Identities,
        _doc("users allowed to change `spec.suspend` of a Kueue-managed TrainJob"),
    ] = DEFAULT_KUEUE_IDENTITIES
    manage_jobs_without_queue_name: Annotated[
        bool,
        _doc(
            "as Kueue's own key: `true` when Kueue manages every TrainJob in the namespaces "
            "`kueue.managedJobsNamespaceSelector` selects, queue-name label or not. Then "
            "those TrainJobs are Kueue's in every part: the enforcer's second webhook entry "
            "refuses anyone else's change of their `spec.suspend`, Start takes them in Kueue "
            "mode and refuses them in plain mode, preflight reports it (below)"
        ),
    ] = False
    managed_jobs_namespace_selector: Annotated[
        LabelSelector,
        _doc(
            "as Kueue's own key: a label selector (`matchLabels`, `matchExpressions` with "
            "`In`, `NotIn`, `Exists`, `DoesNotExist`); set it exactly as Kueue's "
            "configuration has it. Default: Kueue's, every namespace but `kube-system` and "
            "`kueue-system`"
        ),
    ] = field(default_factory=labelselector.kueue_default)


class CertificatesConfig(_Section, frozen=True):
    """Where the serving certificate comes from (docs/how-to/certificates.md).

    ``files``: ``webhook.certDir`` (a mounted Secret, cert-manager's or a manual one).
    ``self-managed``: the enforcer itself keeps a CA and the serving certificate in Secret
    ``secretName`` and injects the CA bundle into ``webhookConfiguration``; one replica
    (the holder of Lease ``leaseName``) writes, every replica serves from the Secret.
    Invariant (checked): caValidity > caRenewBefore >= validity > renewBefore > 0, so a CA
    that is not due for rotation always has room for a whole serving certificate.
    """

    mode: Annotated[
        CertMode,
        _doc(
            "`files`: serve `certDir`'s `tls.crt`/`tls.key`; `self-managed`: keep a CA and "
            "the serving certificate in a Secret, inject the caBundle, rotate "
            "(docs/explanation/self-managed-certificates.md); `holdwarden serve "
            "--certificates` overrides it (the shipped Deployment and chart pass "
            "`--certificates=self-managed`). The keys below apply to `self-managed`"
        ),
    ] = "files"
    secret_name: Annotated[
        NonEmpty, _doc("the Secret (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`)")
    ] = "holdwarden-certificates"
    namespace: Annotated[
        str,
        _doc(
            "of the Secret, the Lease and the Service; empty: the Pod's (as "
            "`readmission.leaseNamespace`)"
        ),
    ] = ""
    webhook_configuration: Annotated[
        NonEmpty,
        _doc("the ValidatingWebhookConfiguration whose every webhook gets the `caBundle`"),
    ] = "holdwarden-enforcer"
    service: Annotated[DnsLabel, _doc("the serving certificate names `S`, `S.NS`, `S.NS.svc`")] = (
        "holdwarden"
    )
    dns_names: Annotated[
        tuple[Annotated[str, Meta(pattern=_DNS_NAME_PATTERN, max_length=253)], ...],
        _doc("more DNS names for the serving certificate"),
    ] = ()
    ip_addresses: Annotated[
        tuple[str, ...],
        _doc(
            "IP addresses for the serving certificate (e.g. `127.0.0.1` when the apiserver "
            "calls a URL)"
        ),
    ] = ()
    ca_validity: Annotated[PositiveDuration, _doc("the CA's life")] = _default("87600h")
    ca_renew_before: Annotated[
        PositiveDuration,
        _doc("how long before the CA's end a new CA is made (overlap rotation)"),
    ] = _default("8760h")
    validity: Annotated[PositiveDuration, _doc("the serving certificate's life")] = _default(
        "2160h"
    )
    renew_before: Annotated[
        PositiveDuration,
        _doc(
            "how long before the serving certificate's end it is renewed. `caValidity > "
            "caRenewBefore ≥ validity > renewBefore > 0`"
        ),
    ] = _default("720h")
    interval: Annotated[
        PositiveDuration,
        _doc("how often every replica reads the Secret and the caBundle (and the leader acts)"),
    ] = _default("10s")
    propagation_delay: Annotated[
        Duration,
        _doc(
            "how long a newly injected CA bundle stands before a certificate from the new CA "
            "is served; old CAs are pruned `propagationDelay + 3 x interval` after the switch"
        ),
    ] = _default("10s")
    lease_name: Annotated[
        NonEmpty, _doc("the Lease whose holder writes the Secret and the caBundle")
    ] = "holdwarden-certificates"
    # A namespace the webhook judges (not kube-system, not the enforcer's own): the probe
    # is a server-side dry-run write the enforcer must refuse. certs/enforcing.py.
    probe_namespace: Annotated[
        DnsLabel,
        _doc(
            "where the leader's verification probe goes before it sets the webhook's "
            "failurePolicy (the one the configuration's annotation "
            "`holdwarden.io/failure-policy` asks for; docs/how-to/certificates.md): a namespace "
            "the webhook judges (not `kube-system`, not the enforcer's); the Role "
            "`holdwarden-enforcer-probe` must be there too. `holdwarden certs enforce "
            "--config` reads it as well"
        ),
    ] = "default"


class AuditEventsConfig(_Section, frozen=True):
    """The Events audit sink (webhook/audit_sinks.py): dedup window, write rate, queue."""

    window: Annotated[
        PositiveDuration,
        _doc(
            "identical refusals (same object, rule, user, operation) within this long of "
            "their Event's last write update that Event's `series` instead of making a new one"
        ),
    ] = _default("10m")
    qps: Annotated[
        float, _doc("Event writes (creates and patches) a second, a number above 0", gt=0)
    ] = 5.0
    burst: Annotated[int, _doc("writes allowed at once above `qps`", ge=1)] = 20
    queue_size: Annotated[
        int,
        _doc(
            "distinct refusals waiting to be written; when full, new ones are dropped and counted",
            ge=1,
        ),
    ] = 1000
    request_timeout: Annotated[PositiveDuration, _doc("each Events API call's timeout")] = _default(
        "5s"
    )


class WebhookConfig(_Section, frozen=True):
    """Where the enforcer listens, keeps its certificate and writes its audit trail."""

    # The optional hold-owner-only rule; empty: the rule is off.
    holder_identities: Annotated[
        Identities,
        _doc(
            "turns on the optional `hold-owner-only` rule (empty: off): only these users, "
            "groups and service accounts (as usernames, `system:serviceaccount:NS:NAME`), and "
            "the break-glass group `system:masters`, may add, change or remove the hold "
            "annotations or reactivate a held Workload. List the supervisor's identity; the "
            "policy twin must list the same (docs/explanation/policy.md)"
        ),
    ] = ()
    workload_deleters: Annotated[
        Identities,
        _doc(
            "who may delete a held Workload (rule `held-workload-kept`): usernames or groups; "
            "by default the garbage collector, the namespace controller and "
            "`system:kube-controller-manager`. Anyone else is refused, since Kueue would "
            "replace the Workload with an active one. Add an identity only if it deletes "
            "Workloads of TrainJobs that are themselves gone"
        ),
    ] = DEFAULT_WORKLOAD_DELETERS
    listen_address: Annotated[
        Address,
        _doc("HTTPS AdmissionReview endpoint (`POST /validate`), plus `/healthz`, `/readyz`"),
    ] = "0.0.0.0:9443"
    cert_dir: Annotated[Path, _doc("holds `tls.crt` and `tls.key`, reloaded when they change")] = (
        _path("/etc/holdwarden/tls")
    )
    audit_log: Annotated[Path, _doc("one JSON line per refusal")] = _path(
        "/var/log/holdwarden/audit.jsonl"
    )
    metrics_address: Annotated[Address, _doc("Prometheus `/metrics` (plain HTTP), `/healthz`")] = (
        "0.0.0.0:9090"
    )
    max_body_bytes: Annotated[
        int,
        _doc(
            "larger AdmissionReview bodies are refused with HTTP 413 (before `100 Continue` "
            "when the client sends `Expect: 100-continue`)",
            ge=1024,
        ),
    ] = 3 * 1024 * 1024
    # Connections (docs/explanation/connections.md). The idle timeout is longer
    # than the kube-apiserver's own (90 s), so the apiserver, not this server, closes an
    # idle connection: a server-side close can race a POST that Go will not retry.
    idle_timeout: Annotated[
        PositiveDuration,
        _doc(
            "a keep-alive connection with no request is closed this long after its last "
            "answer; longer than the kube-apiserver's own 90 s, so the apiserver closes first"
        ),
    ] = _default("120s")
    header_timeout: Annotated[
        PositiveDuration,
        _doc(
            "the TLS handshake and a request's headers must arrive within this (from accept "
            "for the first request, from its first byte for later ones); slowloris "
            "connections are cut off"
        ),
    ] = _default("10s")
    body_timeout: Annotated[
        PositiveDuration,
        _doc(
            "a request's body must arrive within this after its headers, or it is answered "
            "408 and the connection closed"
        ),
    ] = _default("10s")
    max_connections: Annotated[
        int,
        _doc(
            "open TLS connections at most; at the cap the longest-idle one is closed to make "
            "room, a request in progress never is",
            ge=1,
        ),
    ] = 300
    event_loop: Annotated[
        EventLoop,
        _doc(
            "the enforcer's event loop: `uvloop` (less CPU per review; "
            "docs/performance/throughput.md) or Python's own `asyncio`; the TLS port keeps "
            "the same limits on both"
        ),
    ] = "uvloop"
    max_in_flight_body_bytes: Annotated[
        int,
        _doc(
            "request bodies held in memory at once, all connections together (at least "
            "`maxBodyBytes`); a request waits for room within its `bodyTimeout`",
            ge=1024,
        ),
    ] = 32 * 1024 * 1024
    client_ca_file: Annotated[
        Path | None,
        _doc(
            "PEM CA bundle; when set, only clients with a certificate it signed can connect "
            "(mutual TLS; see docs/how-to/mutual-tls.md for the apiserver side)"
        ),
    ] = field(default=None, name="clientCAFile")
    # Graceful shutdown on SIGTERM: serve (readiness failing) for shutdownDelay, then stop
    # accepting and finish in-flight requests for at most drainTimeout.
    shutdown_delay: Annotated[
        Duration,
        _doc(
            "after SIGTERM, keep serving this long while `/readyz` fails, so endpoints move "
            "away first"
        ),
    ] = _default("5s")
    drain_timeout: Annotated[
        PositiveDuration,
        _doc(
            "then, at most this long to answer the requests in flight; what is left is cut "
            "off. `preStop` + `shutdownDelay` + `drainTimeout` must fit in the Pod's "
            "`terminationGracePeriodSeconds`"
        ),
    ] = _default("15s")
    # The audit log's disk budget: at most auditMaxBytes * (auditMaxFiles + 1) bytes.
    audit_max_bytes: Annotated[
        int,
        # The floor leaves room for several of the largest (8 KiB) lines per file.
        _doc("the audit log is rotated before it would grow past this", ge=65536),
    ] = 100 * 1024 * 1024
    audit_max_files: Annotated[
        int,
        _doc(
            "rotated audit files kept (`audit.jsonl.1` … `.5`); the log never takes more than "
            "`auditMaxBytes x (auditMaxFiles + 1)`",
            ge=1,
            le=1000,
        ),
    ] = 5
    audit_sinks: Annotated[
        tuple[str, ...],
        _doc(
            "where each refusal is recorded, one or more of `file` (`webhook.auditLog`, "
            'fsynced), `stdout` (a JSON line marked `"audit": true`) and `events` (Kubernetes '
            "Events); the shipped manifests use `[stdout]`. `holdwarden serve --audit-sink "
            "NAME` (repeatable) replaces it. docs/reference/audit-format.md",
            extra_json_schema={
                "items": {"enum": list(AUDIT_SINKS)},
                "minItems": 1,
                "uniqueItems": True,
            },
        ),
    ] = ("file",)
    audit_events: AuditEventsConfig = field(default_factory=AuditEventsConfig)
    certificates: CertificatesConfig = field(default_factory=CertificatesConfig)


class MultiKueueConfig(_Section, frozen=True):
    """MultiKueue manager clusters: a job MultiKueue dispatches is readmitted only once
    every worker cluster has been counted clear, through the kubeconfig Secrets its
    MultiKueueClusters name."""

    kueue_namespace: Annotated[
        DnsLabel,
        _doc(
            "Kueue's namespace, where the `MultiKueueCluster`s' kubeconfig Secrets are (the "
            "component's Role grants `get` on Secrets there only); "
            'docs/explanation/readmission-gate.md, "MultiKueue"'
        ),
    ] = "kueue-system"
    worker_timeout: Annotated[
        PositiveDuration,
        _doc(
            "the timeout of each request to a worker cluster (no retries): a silent worker "
            "costs a decision at most twice this"
        ),
    ] = _default("5s")
    worker_recheck: Annotated[
        PositiveDuration,
        _doc(
            "a worker that could not be counted is not asked again for this long (it counts "
            'as "pods may remain"); a waiting job is also decided again this often (or every '
            "`readmission.interval`, if shorter)"
        ),
    ] = _default("5s")


class ReadmissionConfig(_Section, frozen=True):
    """The readmission gate: a Kueue AdmissionCheck controller run by ``holdwarden gate``
    (its own process and Deployment). ``enabled`` says whether it is installed: the shipped
    manifests and chart run the gate's Deployment only then, and ``holdwarden serve`` no
    longer runs it whatever it says. Invariant (checked): leaseDuration > renewDeadline >
    1.2 x retryPeriod > 0 (client-go's rules)."""

    enabled: Annotated[
        bool,
        _doc(
            "the readmission gate (a Kueue AdmissionCheck controller) is installed: the "
            "component `manifests/readmission` and the chart's `readmission.enabled` set it "
            "beside the gate's own Deployment, which runs `holdwarden gate`. `holdwarden "
            "serve` never runs the gate, whatever this says; "
            "docs/explanation/readmission-gate.md"
        ),
    ] = False
    metrics_address: Annotated[
        Address,
        _doc(
            "where `holdwarden gate` serves `/metrics`, `/healthz` (liveness) and `/readyz` "
            "(readiness), plain HTTP; `--metrics` overrides it"
        ),
    ] = "0.0.0.0:9091"
    controller_name: Annotated[
        NonEmpty, _doc("the AdmissionChecks served: those whose `spec.controllerName` is this")
    ] = "holdwarden.io/readmission"
    interval: Annotated[
        PositiveDuration,
        _doc(
            "the resync: every gated Workload is decided again from the watch cache this "
            "often (no API request), a safety net behind the watch events"
        ),
    ] = _default("30s")
    leader_election: Annotated[
        bool,
        _doc(
            "only the holder of a Lease writes; other replicas keep their caches warm. Off: "
            "every replica writes (safe by the preconditions, but each does the work)"
        ),
    ] = True
    lease_name: Annotated[
        NonEmpty,
        _doc(
            "the Lease (`coordination.k8s.io/v1`); the component's Role grants get/update on "
            "this name only"
        ),
    ] = "holdwarden-readmission"
    lease_namespace: Annotated[
        str,
        _doc(
            "the Lease's namespace; empty: the Pod's (`$POD_NAMESPACE`, else the service "
            "account's namespace file, else `default` outside a cluster)"
        ),
    ] = ""
    lease_duration: Annotated[
        Duration,
        _doc(
            "how long followers wait, after last seeing the Lease change, before taking it; "
            "longer than `renewDeadline`"
        ),
    ] = _default("15s")
    renew_deadline: Annotated[
        Duration,
        _doc(
            "the leader stops acting this long after its last successful renewal; longer "
            "than 1.2 x `retryPeriod`"
        ),
    ] = _default("10s")
    retry_period: Annotated[
        PositiveDuration, _doc("how often the leader renews and followers try to acquire")
    ] = _default("2s")
    watch_timeout: Annotated[
        Duration,
        _doc(
            "server-side `timeoutSeconds` of each watch request (the watch then resumes from "
            "its resourceVersion); at least `1s`"
        ),
    ] = _default("5m")
    multi_kueue: MultiKueueConfig = field(default_factory=MultiKueueConfig)


class Config(_Section, frozen=True):
    """holdwarden's whole configuration. The adapter and the enforcer read the same one."""

    mode: Annotated[
        Mode,
        _doc(
            "`kueue`: the hold is the Workload's `spec.active: false`; `plain`: the TrainJob's "
            "`spec.suspend: true` (adapter only; the enforcer decides per object)"
        ),
    ] = "kueue"
    annotation_prefix: Annotated[
        str,
        _doc(
            "prefix `P` of every annotation (`P/hold-instance`, …); a DNS subdomain",
            pattern=_PREFIX_PATTERN,
            max_length=253,
        ),
    ] = DEFAULT_ANNOTATION_PREFIX
    holder: Annotated[str, _doc("written to `P/held-by` by Hold; not blank")] = "holdwarden"
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    kueue: KueueConfig = field(default_factory=KueueConfig)
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    readmission: ReadmissionConfig = field(default_factory=ReadmissionConfig)

    # The flat names most of the code (and tests) read; each is one key of the file.
    @property
    def apiserver_request_timeout(self) -> timedelta:
        return self.timeouts.apiserver_request

    @property
    def kueue_identities(self) -> tuple[str, ...]:
        return self.kueue.identities

    @property
    def kueue_manage_jobs_without_queue_name(self) -> bool:
        return self.kueue.manage_jobs_without_queue_name

    @property
    def kueue_managed_jobs_namespace_selector(self) -> LabelSelector:
        return self.kueue.managed_jobs_namespace_selector

    @classmethod
    def from_file(cls, path: str | Path) -> Config:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("<file>", f"cannot read {path}: {exc.strerror}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError("<file>", f"{path} is not valid YAML: {exc}") from exc
        return cls.from_dict(data if data is not None else {})

    @classmethod
    def from_dict(cls, data: Any) -> Config:
        """Decode and check the file's mapping; raise ``ConfigError`` naming the key."""
        try:
            config = msgspec.convert(_prepare(data, Config), Config, dec_hook=_decode)
        except msgspec.ValidationError as exc:
            raise _config_error(exc) from None
        _check(config)
        return config


def encode(config: Config) -> dict[str, Any]:
    """The file's mapping for ``config`` (``Config.from_dict`` reads it back as equal).

    Holds for configs read from a file or left at their defaults: a duration set in code
    as a plain ``timedelta`` would come out in ISO 8601 form, which the file does not take.
    """
    out: dict[str, Any] = msgspec.to_builtins(config, enc_hook=_encode)
    # msgspec writes a dataclass by its Python fields; the file has Kubernetes' form.
    selector = config.kueue.managed_jobs_namespace_selector
    out["kueue"]["managedJobsNamespaceSelector"] = selector.to_dict()
    return out


def split_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too) into its parts."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def check_audit_sinks(sinks: list[str], key: str) -> tuple[str, ...]:
    """At least one sink, each a known name, none twice."""
    if not sinks:
        raise ConfigError(key, f"must name at least one of {', '.join(AUDIT_SINKS)}")
    for sink in sinks:
        if sink not in AUDIT_SINKS:
            raise ConfigError(key, f"{sink!r} is not a sink; use {', '.join(AUDIT_SINKS)}")
    if len(set(sinks)) != len(sinks):
        raise ConfigError(key, "names a sink twice")
    return tuple(sinks)


# -- decoding -------------------------------------------------------------------------------


class _Refusal(ValueError):
    """Raised by the decoding hook; msgspec adds where (``exc.__cause__`` is this)."""


def _decode(kind: type, value: Any) -> Any:
    """msgspec's hook for the types the file writes as strings or mappings of its own."""
    if issubclass(kind, _DurationText):
        try:
            duration = parse_duration(value)
        except ConfigError as exc:
            raise _Refusal(exc.problem) from None
        if kind is _PositiveDurationText and not duration:
            raise _Refusal("must be longer than zero")
        return _as(kind, duration, value)
    if kind is Path:
        if not isinstance(value, str) or not value:
            raise _Refusal(f"must be a file path, got {value!r}")
        return Path(value)
    raise NotImplementedError(kind)


def _encode(value: Any) -> Any:
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, Path):
        return str(value)
    raise NotImplementedError(type(value))


def _prepare(data: Any, struct: type[msgspec.Struct], path: str = "") -> Any:
    """``data`` made ready for msgspec, as the file has always been read: a section or an
    optional key written empty (``webhook:`` alone reads as null) means its defaults, and
    a label selector is read in its Kubernetes form (msgspec would take ``LabelSelector``,
    a dataclass, by its Python fields)."""
    if not isinstance(data, dict):
        return data
    fields = {f.encode_name: _unwrapped(f.type) for f in _fields(struct)}
    out = {}
    for key, value in data.items():
        kind, where = fields.get(key), f"{path}{key}"
        if isinstance(kind, mi.StructType):
            if value is None:
                continue
            value = _prepare(value, kind.cls, where + ".")
        elif isinstance(kind, mi.UnionType) and value in (None, ""):
            continue
        elif isinstance(kind, mi.DataclassType) and kind.cls is LabelSelector:
            if value is None:
                continue
            try:
                value = labelselector.parse(value, where)
            except labelselector.SelectorError as exc:
                raise ConfigError(
                    exc.path,
                    f"{exc.problem}; write it as Kueue's managedJobsNamespaceSelector is written",
                ) from None
        out[key] = value
    return out


def _unwrapped(kind: mi.Type) -> mi.Type:
    while isinstance(kind, mi.Metadata):
        kind = kind.type
    return kind


def _fields(struct: type[msgspec.Struct]) -> tuple[mi.Field, ...]:
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    return info.fields


_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a mapping of keys to values",
    "null": "empty",
}


def _config_error(exc: msgspec.ValidationError) -> ConfigError:
    """Turn msgspec's message (``Expected `int` >= 1 - at `$.webhook.maxConnections```)
    into a ``ConfigError`` with the dotted key and words that say what to write."""
    match = _AT.match(str(exc))
    assert match is not None
    problem, path = match["problem"], match["path"] or ""
    if isinstance(exc.__cause__, _Refusal):
        return ConfigError(_dotted(path), str(exc.__cause__))
    index = re.search(r"\[(\d+)\]$", path)
    where = f"item {index[1]}: " if index else ""
    path = path[: index.start()] if index else path
    if unknown := re.fullmatch(r"Object contains unknown field `(.*)`", problem):
        known = ", ".join(f.encode_name for f in _fields(_struct_at(path)))
        return ConfigError(
            _dotted(f"{path}.{unknown[1]}"), f"unknown key; the keys here are {known} ({DOCS})"
        )
    return ConfigError(_dotted(path), where + _say(problem, path))


def _say(problem: str, path: str) -> str:
    if kinds := re.fullmatch(r"Expected `(\w+)`, got `(\w+)`", problem):
        want, got = (_WORDS.get(k, k) for k in kinds.groups())
        return f"must be {want}, got {got}"
    if bound := re.fullmatch(r"Expected `\w+` (>=|>|<=|<) (\S+)", problem):
        words = {">=": "at least", ">": "above", "<=": "at most", "<": "below"}
        return f"must be {words[bound[1]]} {bound[2]}"
    if re.fullmatch(r"Expected `str` of length >= 1", problem):
        return "must not be empty"
    if form := re.fullmatch(r"Expected `str` matching regex '(.*)'", problem):
        # msgspec quotes the pattern with its backslashes doubled.
        pattern = form[1].replace("\\\\", "\\")
        return f"must be {_FORMS.get(pattern, 'as described in ' + DOCS)}"
    if value := re.fullmatch(r"Invalid enum value (.*)", problem):
        kind = _field_at(path)
        allowed = (
            " or ".join(repr(v) for v in kind.values)
            if isinstance(kind, mi.LiteralType)
            else "a value " + DOCS + " lists"
        )
        return f"{value[1]} is not allowed; use {allowed}"
    return problem


def _dotted(path: str) -> str:
    return path.removeprefix(".") or "<root>"


def _struct_at(path: str) -> type[msgspec.Struct]:
    kind = _field_at(path) if path else mi.type_info(Config)
    assert isinstance(kind, mi.StructType)
    return kind.cls


def _field_at(path: str) -> mi.Type:
    """The type of the key at msgspec's ``path`` (``.webhook.certificates.mode``)."""
    kind: mi.Type = mi.type_info(Config)
    for name in path.removeprefix(".").split("."):
        assert isinstance(kind, mi.StructType)
        kind = _unwrapped(next(f.type for f in kind.fields if f.encode_name == name))
    return kind


def _check(config: Config) -> None:
    """The rules that tie keys together, or that a type alone does not say."""
    if not config.holder.strip():
        raise ConfigError("holder", "must name the holder, e.g. 'dispatch'")
    hook = config.webhook
    if hook.max_in_flight_body_bytes < hook.max_body_bytes:
        raise ConfigError(
            "webhook.maxInFlightBodyBytes",
            f"must be at least webhook.maxBodyBytes ({hook.max_body_bytes}), "
            "or no body could be read",
        )
    check_audit_sinks(list(hook.audit_sinks), "webhook.auditSinks")
    certs = hook.certificates
    spans = {
        "caValidity": certs.ca_validity,
        "caRenewBefore": certs.ca_renew_before,
        "validity": certs.validity,
        "renewBefore": certs.renew_before,
    }
    key = "webhook.certificates."
    for longer, shorter in itertools.pairwise(spans):
        # caRenewBefore may equal validity; the other pairs must be strictly ordered.
        if spans[longer] < spans[shorter] or (
            spans[longer] == spans[shorter] and longer != "caRenewBefore"
        ):
            raise ConfigError(key + shorter, f"must be shorter than {key + longer}")
    for ip in certs.ip_addresses:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(key + "ipAddresses", f"{ip!r} is not an IP address") from None
    gate = config.readmission
    # client-go's rules: leaseDuration > renewDeadline > 1.2 x retryPeriod > 0.
    if gate.renew_deadline <= gate.retry_period * 1.2:
        raise ConfigError("readmission.renewDeadline", "must be longer than 1.2 x retryPeriod")
    if gate.lease_duration <= gate.renew_deadline:
        raise ConfigError("readmission.leaseDuration", "must be longer than renewDeadline")
    if gate.watch_timeout < timedelta(seconds=1):
        raise ConfigError("readmission.watchTimeout", "must be at least 1s")
