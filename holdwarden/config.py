"""The configuration schema: one YAML file, camelCase keys, durations such as ``60s``.

Invariant: a ``Config`` only ever holds validated values. Unknown keys and bad values
raise ``ConfigError`` naming the offending key by its dotted path.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from holdwarden import labelselector
from holdwarden.labelselector import LabelSelector
from holdwarden.vocabulary import (
    DEFAULT_ANNOTATION_PREFIX,
    DEFAULT_KUEUE_IDENTITIES,
    DEFAULT_WORKLOAD_DELETERS,
    Mode,
)

_DURATION_RE = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")
# An RFC 1123 label (a Service name; each label of a DNS name).
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A DNS subdomain, as Kubernetes requires of an annotation key's prefix.
_PREFIX_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class ConfigError(ValueError):
    """A configuration value is unknown or invalid; ``key`` is its dotted path."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"config key {key!r}: {problem}")


def parse_duration(text: str, key: str = "duration") -> timedelta:
    """Parse a Kubernetes-style duration such as ``60s``, ``1m30s``, ``250ms`` or ``2h``."""
    if not isinstance(text, str) or not text or _DURATION_RE.fullmatch(text) is None:
        raise ConfigError(
            key, f"{text!r} is not a duration; write it like '60s', '1m30s' or '250ms'"
        )
    match = _DURATION_RE.fullmatch(text)
    assert match is not None
    hours, minutes, seconds, millis = (int(g) if g else 0 for g in match.groups())
    return timedelta(hours=hours, minutes=minutes, seconds=seconds, milliseconds=millis)


CERT_MODES = ("files", "self-managed")


@dataclass(frozen=True)
class CertificatesConfig:
    """Where the serving certificate comes from (docs/how-to/certificates.md).

    ``files``: ``webhook.certDir`` (a mounted Secret, cert-manager's or a manual one).
    ``self-managed``: the enforcer itself keeps a CA and the serving certificate in Secret
    ``secretName`` and injects the CA bundle into ``webhookConfiguration``; one replica
    (the holder of Lease ``leaseName``) writes, every replica serves from the Secret.
    Invariant (checked): caValidity > caRenewBefore >= validity > renewBefore > 0, so a CA
    that is not due for rotation always has room for a whole serving certificate.
    """

    mode: str = "files"
    secret_name: str = "holdwarden-certificates"
    namespace: str = ""  # "" = the Pod's namespace (as readmission.leaseNamespace)
    webhook_configuration: str = "holdwarden-enforcer"
    service: str = "holdwarden"
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    ca_validity: timedelta = timedelta(days=3650)
    ca_renew_before: timedelta = timedelta(days=365)
    validity: timedelta = timedelta(days=90)
    renew_before: timedelta = timedelta(days=30)
    interval: timedelta = timedelta(seconds=10)
    propagation_delay: timedelta = timedelta(seconds=10)
    lease_name: str = "holdwarden-certificates"
    # Where the leader's verification probe goes (a server-side dry-run write the enforcer
    # must refuse) before it sets the webhook's failurePolicy: a namespace the webhook
    # judges (not kube-system, not the enforcer's own). certs/enforcing.py.
    probe_namespace: str = "default"


AUDIT_SINKS = ("file", "stdout", "events")


@dataclass(frozen=True)
class AuditEventsConfig:
    """The Events audit sink (webhook/audit_sinks.py): dedup window, write rate, queue."""

    # Identical refusals within this long of their Event's last write update that Event.
    window: timedelta = timedelta(minutes=10)
    # Event writes (creates and series patches) a second, and the burst allowed above it.
    qps: float = 5.0
    burst: int = 20
    # Distinct refusals waiting to be written; when full, new ones are dropped (counted).
    queue_size: int = 1000
    # Each Events API call's timeout.
    request_timeout: timedelta = timedelta(seconds=5)


@dataclass(frozen=True)
class WebhookConfig:
    """Where the enforcer listens, keeps its certificate and writes its audit trail."""

    listen_address: str = "0.0.0.0:9443"
    cert_dir: Path = Path("/etc/holdwarden/tls")
    audit_log: Path = Path("/var/log/holdwarden/audit.jsonl")
    metrics_address: str = "0.0.0.0:9090"
    max_body_bytes: int = 3 * 1024 * 1024
    # Connections (docs/explanation/connections.md). The idle timeout is longer
    # than the kube-apiserver's own (90 s), so the apiserver, not this server, closes an
    # idle connection: a server-side close can race a POST that Go will not retry.
    idle_timeout: timedelta = timedelta(seconds=120)
    header_timeout: timedelta = timedelta(seconds=10)
    body_timeout: timedelta = timedelta(seconds=10)
    max_connections: int = 300
    max_in_flight_body_bytes: int = 32 * 1024 * 1024
    # Optional mutual TLS: callers must present a certificate signed by this CA.
    client_ca_file: Path | None = None
    # Graceful shutdown on SIGTERM: serve (readiness failing) for shutdown_delay, then
    # stop accepting and finish in-flight requests for at most drain_timeout.
    shutdown_delay: timedelta = timedelta(seconds=5)
    drain_timeout: timedelta = timedelta(seconds=15)
    # The audit log's disk budget: at most audit_max_bytes * (audit_max_files + 1) bytes
    # (the current file and audit_max_files rotated ones).
    audit_max_bytes: int = 100 * 1024 * 1024
    audit_max_files: int = 5
    # Where each refusal is recorded (docs/configuration.md): file, stdout, events.
    audit_sinks: tuple[str, ...] = ("file",)
    audit_events: AuditEventsConfig = field(default_factory=AuditEventsConfig)
    # hold-owner-only: the users, groups and service accounts (as their usernames,
    # system:serviceaccount:NS:NAME) that may change the hold annotations. Empty: rule off.
    holder_identities: tuple[str, ...] = ()
    # held-workload-kept: the identities that may delete a held Workload.
    workload_deleters: tuple[str, ...] = DEFAULT_WORKLOAD_DELETERS
    certificates: CertificatesConfig = field(default_factory=CertificatesConfig)


@dataclass(frozen=True)
class ReadmissionConfig:
    """The readmission gate: a Kueue AdmissionCheck controller run by ``holdwarden gate``
    (its own process and Deployment). ``enabled`` says whether it is installed: the shipped
    manifests and chart run the gate's Deployment only then, and ``holdwarden serve`` no
    longer runs it whatever it says."""

    enabled: bool = False
    # The gate process's metrics and health endpoints (GET /metrics, /healthz, /readyz).
    metrics_address: str = "0.0.0.0:9091"
    controller_name: str = "holdwarden.io/readmission"
    # The resync period: every gated Workload is decided again from the watch cache this
    # often (no API request), a safety net behind the watch events.
    interval: timedelta = timedelta(seconds=30)
    # Only the holder of this Lease writes; the other replicas keep their caches warm.
    # leaseNamespace "" means the Pod's namespace ($POD_NAMESPACE, else the service
    # account's namespace file, else "default" outside a cluster).
    leader_election: bool = True
    lease_name: str = "holdwarden-readmission"
    lease_namespace: str = ""
    lease_duration: timedelta = timedelta(seconds=15)
    renew_deadline: timedelta = timedelta(seconds=10)
    retry_period: timedelta = timedelta(seconds=2)
    # Server-side timeoutSeconds of each watch request; the watch resumes after it.
    watch_timeout: timedelta = timedelta(minutes=5)
    # MultiKueue (readmission.multiKueue): on a manager cluster, a job MultiKueue dispatches
    # is readmitted only once every worker cluster has been counted clear, through the
    # kubeconfig Secrets its MultiKueueClusters name. Those Secrets live in Kueue's
    # namespace; each request to a worker is bounded by workerTimeout (no retries), and a
    # worker that failed is not asked again for workerRecheck (it stays "pods may remain").
    multikueue_kueue_namespace: str = "kueue-system"
    multikueue_worker_timeout: timedelta = timedelta(seconds=5)
    multikueue_worker_recheck: timedelta = timedelta(seconds=5)


@dataclass(frozen=True)
class Config:
    """holdwarden's whole configuration. The adapter and the enforcer read the same one."""

    mode: Mode = "kueue"
    annotation_prefix: str = DEFAULT_ANNOTATION_PREFIX
    holder: str = "holdwarden"
    apiserver_request_timeout: timedelta = timedelta(seconds=60)
    kueue_identities: tuple[str, ...] = DEFAULT_KUEUE_IDENTITIES
    # Kueue's manageJobsWithoutQueueName and managedJobsNamespaceSelector, as Kueue is
    # configured: with it on, a TrainJob without the queue-name label in a namespace the
    # selector selects is Kueue's too, in every part (docs/configuration.md).
    kueue_manage_jobs_without_queue_name: bool = False
    kueue_managed_jobs_namespace_selector: LabelSelector = field(
        default_factory=labelselector.kueue_default
    )
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    readmission: ReadmissionConfig = field(default_factory=ReadmissionConfig)

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
        root = _Section(data, "")
        mode = root.pop_str("mode", "kueue")
        if mode not in ("kueue", "plain"):
            raise ConfigError("mode", f"{mode!r} is not a mode; use 'kueue' or 'plain'")
        prefix = root.pop_str("annotationPrefix", DEFAULT_ANNOTATION_PREFIX)
        if len(prefix) > 253 or _PREFIX_RE.fullmatch(prefix) is None:
            raise ConfigError(
                "annotationPrefix", f"{prefix!r} is not a DNS subdomain such as 'holdwarden.io'"
            )
        holder = root.pop_str("holder", "holdwarden")
        if not holder.strip():
            raise ConfigError("holder", "must name the holder, e.g. 'dispatch'")
        timeouts = root.pop_section("timeouts")
        request_timeout = parse_duration(
            timeouts.pop_str("apiserverRequest", "60s"), "timeouts.apiserverRequest"
        )
        if request_timeout <= timedelta(0):
            raise ConfigError("timeouts.apiserverRequest", "must be longer than zero")
        timeouts.finish()
        kueue = root.pop_section("kueue")
        identities = kueue.pop_str_list("identities", list(DEFAULT_KUEUE_IDENTITIES))
        manage_all = kueue.pop_bool("manageJobsWithoutQueueName", False)
        raw_selector = kueue._data.pop("managedJobsNamespaceSelector", None)
        try:
            namespace_selector = (
                labelselector.kueue_default()
                if raw_selector is None
                else labelselector.parse(raw_selector, kueue._key("managedJobsNamespaceSelector"))
            )
        except labelselector.SelectorError as exc:
            raise ConfigError(
                exc.path,
                f"{exc.problem}; write it as Kueue's managedJobsNamespaceSelector is written",
            ) from None
        kueue.finish()
        hook = root.pop_section("webhook")
        defaults = WebhookConfig()
        max_body = hook.pop_int("maxBodyBytes", defaults.max_body_bytes)
        if max_body < 1024:
            raise ConfigError("webhook.maxBodyBytes", "must be at least 1024")
        hook_timeouts = {
            name: _positive_duration(hook, name, default)
            for name, default in (
                ("idleTimeout", defaults.idle_timeout),
                ("headerTimeout", defaults.header_timeout),
                ("bodyTimeout", defaults.body_timeout),
                ("drainTimeout", defaults.drain_timeout),
            )
        }
        shutdown_delay = parse_duration(
            hook.pop_str("shutdownDelay", _format_duration(defaults.shutdown_delay)),
            "webhook.shutdownDelay",
        )
        max_connections = hook.pop_int("maxConnections", defaults.max_connections)
        if max_connections < 1:
            raise ConfigError("webhook.maxConnections", "must be at least 1")
        in_flight_body = hook.pop_int("maxInFlightBodyBytes", defaults.max_in_flight_body_bytes)
        if in_flight_body < max_body:
            raise ConfigError(
                "webhook.maxInFlightBodyBytes",
                f"must be at least webhook.maxBodyBytes ({max_body}), or no body could be read",
            )
        client_ca = hook.pop_str("clientCAFile", "")
        audit_max_bytes = hook.pop_int("auditMaxBytes", defaults.audit_max_bytes)
        if audit_max_bytes < 65536:
            # Room for several of the largest (8 KiB) lines per file.
            raise ConfigError("webhook.auditMaxBytes", "must be at least 65536")
        audit_max_files = hook.pop_int("auditMaxFiles", defaults.audit_max_files)
        if not 1 <= audit_max_files <= 1000:
            raise ConfigError("webhook.auditMaxFiles", "must be from 1 to 1000")
        audit_sinks = _audit_sinks(hook)
        audit_events = _audit_events(hook.pop_section("auditEvents"))
        holder_identities = hook.pop_str_list("holderIdentities", [])
        workload_deleters = hook.pop_str_list("workloadDeleters", list(DEFAULT_WORKLOAD_DELETERS))
        webhook = WebhookConfig(
            listen_address=_address(
                hook.pop_str("listenAddress", defaults.listen_address), "webhook.listenAddress"
            ),
            cert_dir=Path(hook.pop_str("certDir", str(defaults.cert_dir))),
            audit_log=Path(hook.pop_str("auditLog", str(defaults.audit_log))),
            metrics_address=_address(
                hook.pop_str("metricsAddress", defaults.metrics_address), "webhook.metricsAddress"
            ),
            max_body_bytes=max_body,
            idle_timeout=hook_timeouts["idleTimeout"],
            header_timeout=hook_timeouts["headerTimeout"],
            body_timeout=hook_timeouts["bodyTimeout"],
            max_connections=max_connections,
            max_in_flight_body_bytes=in_flight_body,
            client_ca_file=Path(client_ca) if client_ca else None,
            shutdown_delay=shutdown_delay,
            drain_timeout=hook_timeouts["drainTimeout"],
            audit_max_bytes=audit_max_bytes,
            audit_max_files=audit_max_files,
            audit_sinks=audit_sinks,
            audit_events=audit_events,
            holder_identities=tuple(holder_identities),
            workload_deleters=tuple(workload_deleters),
            certificates=_certificates(hook.pop_section("certificates")),
        )
        hook.finish()
        gate = root.pop_section("readmission")
        gate_defaults = ReadmissionConfig()
        multikueue = gate.pop_section("multiKueue")
        mk_namespace = multikueue.pop_str(
            "kueueNamespace", gate_defaults.multikueue_kueue_namespace
        )
        if _DNS_LABEL_RE.fullmatch(mk_namespace) is None:
            raise ConfigError(
                "readmission.multiKueue.kueueNamespace",
                f"{mk_namespace!r} is not a namespace name; name the namespace Kueue runs in, "
                "e.g. 'kueue-system'",
            )
        mk_timeout = _positive_duration(
            multikueue, "workerTimeout", gate_defaults.multikueue_worker_timeout
        )
        mk_recheck = _positive_duration(
            multikueue, "workerRecheck", gate_defaults.multikueue_worker_recheck
        )
        multikueue.finish()
        readmission = ReadmissionConfig(
            enabled=gate.pop_bool("enabled", gate_defaults.enabled),
            metrics_address=_address(
                gate.pop_str("metricsAddress", gate_defaults.metrics_address),
                "readmission.metricsAddress",
            ),
            controller_name=gate.pop_str("controllerName", gate_defaults.controller_name),
            interval=parse_duration(gate.pop_str("interval", "30s"), "readmission.interval"),
            leader_election=gate.pop_bool("leaderElection", gate_defaults.leader_election),
            lease_name=gate.pop_str("leaseName", gate_defaults.lease_name),
            lease_namespace=gate.pop_str("leaseNamespace", gate_defaults.lease_namespace),
            lease_duration=parse_duration(
                gate.pop_str("leaseDuration", "15s"), "readmission.leaseDuration"
            ),
            renew_deadline=parse_duration(
                gate.pop_str("renewDeadline", "10s"), "readmission.renewDeadline"
            ),
            retry_period=parse_duration(
                gate.pop_str("retryPeriod", "2s"), "readmission.retryPeriod"
            ),
            watch_timeout=parse_duration(
                gate.pop_str("watchTimeout", "5m"), "readmission.watchTimeout"
            ),
            multikueue_kueue_namespace=mk_namespace,
            multikueue_worker_timeout=mk_timeout,
            multikueue_worker_recheck=mk_recheck,
        )
        if not readmission.controller_name:
            raise ConfigError("readmission.controllerName", "must not be empty")
        if readmission.interval <= timedelta(0):
            raise ConfigError("readmission.interval", "must be longer than zero")
        if not readmission.lease_name:
            raise ConfigError("readmission.leaseName", "must not be empty")
        # client-go's rules: leaseDuration > renewDeadline > 1.2 x retryPeriod > 0.
        if readmission.retry_period <= timedelta(0):
            raise ConfigError("readmission.retryPeriod", "must be longer than zero")
        if readmission.renew_deadline <= readmission.retry_period * 1.2:
            raise ConfigError("readmission.renewDeadline", "must be longer than 1.2 x retryPeriod")
        if readmission.lease_duration <= readmission.renew_deadline:
            raise ConfigError("readmission.leaseDuration", "must be longer than renewDeadline")
        if readmission.watch_timeout < timedelta(seconds=1):
            raise ConfigError("readmission.watchTimeout", "must be at least 1s")
        gate.finish()
        root.finish()
        return cls(
            mode=mode,  # type: ignore[arg-type]  # checked above
            annotation_prefix=prefix,
            holder=holder,
            apiserver_request_timeout=request_timeout,
            kueue_identities=tuple(identities),
            kueue_manage_jobs_without_queue_name=manage_all,
            kueue_managed_jobs_namespace_selector=namespace_selector,
            webhook=webhook,
            readmission=readmission,
        )


def _certificates(section: _Section) -> CertificatesConfig:
    d = CertificatesConfig()
    mode = section.pop_str("mode", d.mode)
    if mode not in CERT_MODES:
        raise ConfigError(
            section._key("mode"), f"{mode!r} is not a mode; use 'files' or 'self-managed'"
        )
    names: dict[str, str] = {}
    for key, default in (
        ("secretName", d.secret_name),
        ("webhookConfiguration", d.webhook_configuration),
        ("service", d.service),
        ("leaseName", d.lease_name),
        ("probeNamespace", d.probe_namespace),
    ):
        names[key] = section.pop_str(key, default)
        if not names[key]:
            raise ConfigError(section._key(key), "must not be empty")
    spans = {
        key: _positive_duration(section, key, default)
        for key, default in (
            ("caValidity", d.ca_validity),
            ("caRenewBefore", d.ca_renew_before),
            ("validity", d.validity),
            ("renewBefore", d.renew_before),
            ("interval", d.interval),
        )
    }
    delay = parse_duration(
        section.pop_str("propagationDelay", _format_duration(d.propagation_delay)),
        section._key("propagationDelay"),
    )
    order = ("caValidity", "caRenewBefore", "validity", "renewBefore")
    for longer, shorter in itertools.pairwise(order):
        # caRenewBefore may equal validity; the other pairs must be strictly ordered.
        if spans[longer] < spans[shorter] or (
            spans[longer] == spans[shorter] and longer != "caRenewBefore"
        ):
            raise ConfigError(section._key(shorter), f"must be shorter than {section._key(longer)}")
    for key in ("service", "probeNamespace"):
        if _DNS_LABEL_RE.fullmatch(names[key]) is None:
            raise ConfigError(section._key(key), f"{names[key]!r} is not a DNS label")
    dns_names = section.pop_str_list("dnsNames", [])
    for name in dns_names:
        if len(name) > 253 or not all(_DNS_LABEL_RE.fullmatch(p) for p in name.split(".")):
            raise ConfigError(section._key("dnsNames"), f"{name!r} is not a DNS name")
    ips = section.pop_str_list("ipAddresses", [])
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(section._key("ipAddresses"), f"{ip!r} is not an IP address") from None
    result = CertificatesConfig(
        mode=mode,
        secret_name=names["secretName"],
        namespace=section.pop_str("namespace", d.namespace),
        webhook_configuration=names["webhookConfiguration"],
        service=names["service"],
        dns_names=tuple(dns_names),
        ip_addresses=tuple(ips),
        ca_validity=spans["caValidity"],
        ca_renew_before=spans["caRenewBefore"],
        validity=spans["validity"],
        renew_before=spans["renewBefore"],
        interval=spans["interval"],
        propagation_delay=delay,
        lease_name=names["leaseName"],
        probe_namespace=names["probeNamespace"],
    )
    section.finish()
    return result


def _format_duration(value: timedelta) -> str:
    return f"{int(value.total_seconds() * 1000)}ms"


def _positive_duration(section: _Section, name: str, default: timedelta) -> timedelta:
    key = section._key(name)
    value = parse_duration(section.pop_str(name, _format_duration(default)), key)
    if value <= timedelta(0):
        raise ConfigError(key, "must be longer than zero")
    return value


def _audit_sinks(hook: _Section) -> tuple[str, ...]:
    key = hook._key("auditSinks")
    sinks = hook.pop_str_list("auditSinks", ["file"])
    return check_audit_sinks(sinks, key)


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


def _audit_events(section: _Section) -> AuditEventsConfig:
    defaults = AuditEventsConfig()
    window = _positive_duration(section, "window", defaults.window)
    request_timeout = _positive_duration(section, "requestTimeout", defaults.request_timeout)
    qps = section._data.pop("qps", defaults.qps)
    if isinstance(qps, bool) or not isinstance(qps, int | float) or qps <= 0:
        raise ConfigError(section._key("qps"), f"must be a number above 0, got {qps!r}")
    burst = section.pop_int("burst", defaults.burst)
    if burst < 1:
        raise ConfigError(section._key("burst"), "must be at least 1")
    queue_size = section.pop_int("queueSize", defaults.queue_size)
    if queue_size < 1:
        raise ConfigError(section._key("queueSize"), "must be at least 1")
    section.finish()
    return AuditEventsConfig(window, float(qps), burst, queue_size, request_timeout)


def split_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too) into its parts."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def _address(value: str, key: str) -> str:
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(key, f"{value!r} is not host:port, e.g. '0.0.0.0:9443'")
    return value


class _Section:
    """One mapping of the YAML file; pops known keys, then rejects whatever is left."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(path or "<root>", "must be a mapping of keys to values")
        self._data = dict(data)
        self._path = path

    def _key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def pop_str(self, name: str, default: str) -> str:
        value = self._data.pop(name, default)
        if not isinstance(value, str):
            raise ConfigError(self._key(name), f"must be a string, got {type(value).__name__}")
        return value

    def pop_int(self, name: str, default: int) -> int:
        value = self._data.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self._key(name), f"must be an integer, got {value!r}")
        return value

    def pop_bool(self, name: str, default: bool) -> bool:
        value = self._data.pop(name, default)
        if not isinstance(value, bool):
            raise ConfigError(self._key(name), f"must be true or false, got {value!r}")
        return value

    def pop_str_list(self, name: str, default: list[str]) -> list[str]:
        value = self._data.pop(name, default)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(self._key(name), "must be a list of non-empty strings")
        return value

    def pop_section(self, name: str) -> _Section:
        return _Section(self._data.pop(name, {}) or {}, self._key(name))

    def finish(self) -> None:
        if self._data:
            unknown = sorted(str(k) for k in self._data)
            raise ConfigError(
                self._key(unknown[0]),
                "unknown key; known keys are documented in docs/configuration.md",
            )
