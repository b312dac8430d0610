"""Self-managed certificates: the enforcer keeps its own CA and serving certificate.

``webhook.certificates.mode: self-managed``
(docs/explanation/self-managed-certificates.md). Every replica runs a
``SelfManagedTLS`` as its TLS source. Each ``interval`` it reads the Secret
``secretName`` and the ValidatingWebhookConfiguration ``webhookConfiguration``, serves
the Secret's ``tls.crt``/``tls.key`` from memory (no file, no volume), and is ready only
while that certificate is signed by a CA in the caBundle the configuration carries.
The replica holding Lease ``leaseName`` also writes: it asks ``holdwarden.certs.plan.decide`` for
the next step and does it (create the Secret, rotate the CA, inject the bundle, renew the
serving certificate, prune old CAs), re-reading after each write.

The Secret (type ``kubernetes.io/tls``):
  ``ca.crt``  the CA bundle, PEM, newest first: what is injected as ``caBundle``;
  ``ca.key``  the key of the signing CA (the one of the bundle it belongs to);
  ``tls.crt`` ``tls.key``  the serving certificate and its key.

Invariants:
  - every write is preconditioned: the Secret is created (409: another replica won; it
    is read next), or updated with the resourceVersion it was decided on; the caBundle
    with the configuration's (certs/inject.py); a write is made only while
    ``LeaseElector.is_leader()``;
  - every API request has a timeout; a failure is logged, counted in ``errors``, and
    retried at the next interval (backing off to 8 intervals); ``watch`` never ends on
    an error, only cancellation stops it (and releases the Lease);
  - a Secret whose contents are wrong is never overwritten: the error names the Secret
    and the key, pods keep serving what they have, readiness says why;
  - the served pair is checked (``holdwarden.certs.reload.check_pair``) before the live context
    gets it, on the event loop thread.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs import enforcing, plan
from holdwarden.certs.bundle import (
    CA_BUNDLE,
    CA_KEY,
    TLS_CERT,
    TLS_KEY,
    CertDirError,
    check_cert_set,
    encode_bundle,
    parse_bundle,
)
from holdwarden.certs.generate import (
    DEFAULT_BACKDATE,
    KeyPair,
    fingerprint,
    generate_ca,
    generate_serving,
)
from holdwarden.certs.inject import InjectError, inject_ca_bundle
from holdwarden.certs.reload import ReloadError, _new_context, check_pair, install_pair
from holdwarden.certs.rotate import bundle_with_new_ca
from holdwarden.config import CertificatesConfig, Config
from holdwarden.leaderelection import ElectionTiming, LeaseElector, pod_namespace

log = logging.getLogger("holdwarden.certs.selfmanaged")
# How long the watch's end may take to stop campaigning and release the Lease: less than
# the EnforcerServer waits for it at stop (holdwarden.cli.serve.TLS_STOP_SECONDS).
LEASE_STOP_SECONDS = 1.5

MAX_STEPS = 8  # writes per interval at most: create, inject, ... then wait for the next
MAX_BACKOFF = 8  # intervals between tries after failures, at most


class SecretError(ValueError):
    """The Secret's contents cannot be used; the message names the Secret and the key."""


@dataclass(frozen=True)
class CertSet:
    """The Secret, parsed and cross-checked."""

    bundle: tuple[x509.Certificate, ...]
    ca: KeyPair
    serving: KeyPair
    resource_version: str


@dataclass(frozen=True)
class Snapshot:
    """What one sync saw; handed from the worker thread to the event loop."""

    certs: CertSet | None
    injected: tuple[x509.Certificate, ...] | None
    error: str | None


def serving_names(settings: CertificatesConfig, namespace: str) -> frozenset[str]:
    """The SANs a serving certificate must carry, as ``DNS:name`` / ``IP:address``."""
    svc = settings.service
    dns = [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc", *settings.dns_names]
    # Normalised as the certificate will carry them (e.g. IPv6 zeros compressed).
    ips = [str(ipaddress.ip_address(ip)) for ip in settings.ip_addresses]
    return frozenset([f"DNS:{d}" for d in dns] + [f"IP:{ip}" for ip in ips])


def names_of(cert: x509.Certificate) -> frozenset[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    dns = [f"DNS:{d}" for d in sans.get_values_for_type(x509.DNSName)]
    ips = [f"IP:{ip}" for ip in sans.get_values_for_type(x509.IPAddress)]
    return frozenset(dns + ips)


def issuer_of(cert: x509.Certificate, cas: tuple[x509.Certificate, ...]) -> x509.Certificate | None:
    """The CA among ``cas`` whose signature ``cert`` carries, if any."""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ca
    return None


def parse_secret(data: dict[str, str] | None, where: str, resource_version: str) -> CertSet:
    """The Secret's four keys (base64, as the API gives them), checked; ``SecretError``
    names ``where`` (``Secret NS/NAME``) and the key at fault."""
    data = data or {}
    raw: dict[str, bytes] = {}
    for key in (CA_BUNDLE, CA_KEY, TLS_CERT, TLS_KEY):
        if key not in data:
            raise SecretError(
                f"{where} has no key {key!r}; it is not one the self-managed mode made "
                f"(delete it and the leader makes a new one)"
            )
        try:
            raw[key] = base64.b64decode(data[key], validate=True)
        except ValueError:
            raise SecretError(f"{where} key {key!r} is not base64") from None
    serving = KeyPair(raw[TLS_CERT], raw[TLS_KEY])
    try:
        bundle, ca = check_cert_set(
            raw[CA_BUNDLE], raw[CA_KEY], serving, lambda key: f"{where} key {key!r}"
        )
    except CertDirError as exc:
        raise SecretError(str(exc)) from None
    return CertSet(bundle, ca, serving, resource_version)


def view_of(
    certs: CertSet | None,
    injected: tuple[x509.Certificate, ...] | None,
    injected_for: timedelta,
    now: datetime,
) -> plan.View:
    """Reduce what was read to what ``plan.decide`` needs."""
    secret = None
    if certs is not None:
        cert = certs.serving.certificate
        issuer = issuer_of(cert, certs.bundle)
        secret = plan.Secret(
            bundle=tuple(plan.CA(fingerprint(c), c.not_valid_after_utc) for c in certs.bundle),
            signing=certs.ca.fingerprint,
            serving=plan.Serving(
                issuer="" if issuer is None else fingerprint(issuer),
                # The leader backdates by exactly DEFAULT_BACKDATE (the CA's notBefore is
                # backdated as much, so the clamp in holdwarden.certs.generate never applies).
                issued_at=cert.not_valid_before_utc + DEFAULT_BACKDATE,
                not_after=cert.not_valid_after_utc,
                names=names_of(cert),
            ),
        )
    fps = None if injected is None else frozenset(fingerprint(c) for c in injected)
    return plan.View(secret, fps, injected_for, now)


class SelfManagedTLS:
    """A TLS source (``holdwarden.webhook.server.TLSSource``, served by ``holdwarden serve``) fed
    from the Secret, and, on the Lease holder, the writer of that Secret and of the caBundle."""

    def __init__(
        self,
        config: Config,
        api_client: k8s.ApiClient,
        *,
        verify: enforcing.Verifier,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
    ) -> None:
        self.config = config
        # How the leader verifies the enforcer answers before it sets failurePolicy Fail
        # (certs/enforcing.py; the roof hands in the adapter's preflight probe).
        self.verify = verify
        self.settings = config.webhook.certificates
        self.namespace = self.settings.namespace or pod_namespace()
        self.where = f"Secret {self.namespace}/{self.settings.secret_name}"
        self.request_timeout = min(10.0, config.apiserver_request_timeout.total_seconds())
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.admission = k8s.AdmissionregistrationV1Api(api_client)
        self.elector = LeaseElector(
            api_client,
            namespace=self.namespace,
            name=self.settings.lease_name,
            identity=identity,
            timing=timing,
            request_timeout=self.request_timeout,
        )
        interval = self.settings.interval
        self.policy = plan.Policy(
            ca_renew_before=self.settings.ca_renew_before,
            renew_before=self.settings.renew_before,
            propagation_delay=self.settings.propagation_delay,
            # Every replica reads the Secret each interval: three of them, after the
            # apiserver had its propagation delay, and every replica serves the new one.
            prune_after=self.settings.propagation_delay + 3 * interval,
            names=serving_names(self.settings, self.namespace),
        )
        self._context = _new_context()
        self._served: x509.Certificate | None = None
        self._served_pems: tuple[bytes, bytes] | None = None
        self._rejected_pems: tuple[bytes, bytes] | None = None
        self._injected: tuple[x509.Certificate, ...] | None = None
        self._injected_key: frozenset[str] | None = None
        self._injected_seen = time.monotonic()
        self.rejected: dict[str, int] = {}
        self.errors = 0
        self.writes: dict[str, int] = {}
        self.last_error: str | None = None
        self.synced = False
        self._configuration: Any = None
        # The leader's last word on the webhook's failurePolicy (certs/enforcing.py).
        self.failure_policy: str | None = None

    # -- TLSSource ----------------------------------------------------------------------

    @property
    def ssl_context(self) -> ssl.SSLContext:
        return self._context

    @property
    def not_after(self) -> datetime | None:
        return None if self._served is None else self._served.not_valid_after_utc

    @property
    def loaded_fingerprint(self) -> str | None:
        return None if self._served is None else fingerprint(self._served)

    def unready_reason(self) -> str | None:
        """Why /readyz must fail now, or None: ready only while the served certificate is
        signed by a CA that is in the injected caBundle."""
        if self._served is None:
            why = self.last_error or f"waiting for {self.where}"
            return f"no serving certificate yet ({why})"
        if self._injected is None and self.synced:
            return (
                f"ValidatingWebhookConfiguration {self.settings.webhook_configuration!r} "
                f"does not exist"
            )
        if not self._injected or issuer_of(self._served, self._injected) is None:
            return (
                f"the serving certificate's CA is not yet in the caBundle of "
                f"ValidatingWebhookConfiguration {self.settings.webhook_configuration!r}"
            )
        return None

    async def watch(self) -> None:
        """Sync every interval until cancelled; campaign for the Lease meanwhile."""
        interval = self.settings.interval.total_seconds()
        self.elector.start()
        failures = 0
        try:
            while True:
                try:
                    snapshot = await asyncio.wait_for(
                        asyncio.to_thread(self.sync), timeout=MAX_STEPS * 3 * self.request_timeout
                    )
                    self._apply(snapshot)
                    failures = failures + 1 if snapshot.error else 0
                except Exception as exc:  # never end on an error
                    failures += 1
                    self.errors += 1
                    self.last_error = f"certificate sync failed: {exc}"
                    log.exception("self-managed certificates: sync failed")
                await asyncio.sleep(interval * min(2 ** max(failures - 1, 0), MAX_BACKOFF))
        finally:
            await asyncio.to_thread(self.elector.stop, timeout=LEASE_STOP_SECONDS)

    # -- one sync (worker thread) -------------------------------------------------------

    def sync(self) -> Snapshot:
        """Read; if leader, do up to ``MAX_STEPS`` steps, re-reading after each write."""
        certs: CertSet | None = None
        injected: tuple[x509.Certificate, ...] | None = None
        try:
            for _ in range(MAX_STEPS):
                certs = self._read_secret()
                injected = self._read_injected()
                if not self.elector.is_leader():
                    break
                view = view_of(certs, injected, self._injected_for(), datetime.now(UTC))
                step = plan.decide(view, self.policy)
                if step.action in (plan.Action.NOTHING, plan.Action.WAIT):
                    break
                log.info(
                    "self-managed certificates: %s",
                    step.action.value,
                    extra={"fields": {"reason": step.reason, "secret": self.where}},
                )
                self._do(step.action, certs)
                self.writes[step.action.value] = self.writes.get(step.action.value, 0) + 1
            self._reconcile_failure_policy(certs, injected)
        except (SecretError, InjectError, ValueError) as exc:
            self._fail(str(exc))
            return Snapshot(certs, injected, str(exc))
        except ApiException as exc:
            message = f"API request failed: {exc.status} {exc.reason}"
            self._fail(message)
            return Snapshot(certs, injected, message)
        except Exception as exc:  # a timeout, a refused connection: retried later
            message = f"sync failed: {type(exc).__name__}: {exc}"
            self._fail(message)
            return Snapshot(certs, injected, message)
        return Snapshot(certs, injected, None)

    def _reconcile_failure_policy(
        self, certs: CertSet | None, injected: tuple[x509.Certificate, ...] | None
    ) -> None:
        """The leader, once the Secret's bundle is the injected one, sets the failurePolicy
        the configuration asks for, ``Fail`` only after verifying the enforcer answers
        (certs/enforcing.py). Checked every interval: a re-apply that reset it is undone."""
        if certs is None or not injected or self._configuration is None:
            return
        if not self.elector.is_leader():
            return
        if {fingerprint(c) for c in injected} != {fingerprint(c) for c in certs.bundle}:
            return  # the bundle is not injected yet (or is being rotated): next interval
        verdict = enforcing.reconcile(
            self.config, self.api, self._configuration, self.request_timeout, self.verify
        )
        if verdict.changed:
            self.writes["failure-policy"] = self.writes.get("failure-policy", 0) + 1
        if verdict.changed or verdict.reason != self.failure_policy:
            log.info(
                "self-managed certificates: %s",
                verdict.reason,
                extra={
                    "fields": {
                        "webhookConfiguration": self.settings.webhook_configuration,
                        "wanted": verdict.wanted,
                        "was": ",".join(verdict.current),
                    }
                },
            )
        self.failure_policy = verdict.reason

    def _fail(self, message: str) -> None:
        self.errors += 1
        log.warning("self-managed certificates: %s", message)

    def _injected_for(self) -> timedelta:
        return timedelta(seconds=time.monotonic() - self._injected_seen)

    def _read_secret(self) -> CertSet | None:
        try:
            secret: Any = self.core.read_namespaced_secret(
                self.settings.secret_name, self.namespace, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return parse_secret(secret.data, self.where, secret.metadata.resource_version)

    def _read_injected(self) -> tuple[x509.Certificate, ...] | None:
        """The CAs of the caBundle every webhook carries; () when they differ or none has
        one; None when the configuration does not exist."""
        name = self.settings.webhook_configuration
        try:
            config: Any = self.admission.read_validating_webhook_configuration(
                name, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                self._configuration = None
                self._note_injected(None)
                return None
            raise
        self._configuration = config
        bundles = {(w.client_config.ca_bundle or "") for w in config.webhooks or []}
        certs: tuple[x509.Certificate, ...] = ()
        if len(bundles) == 1:
            try:
                certs = tuple(parse_bundle(base64.b64decode(bundles.pop())))
            except (ValueError, CertDirError):
                certs = ()
        self._note_injected(frozenset(fingerprint(c) for c in certs))
        return certs

    def _note_injected(self, key: frozenset[str] | None) -> None:
        # The propagation delay runs from when this replica first saw this caBundle; a new
        # leader therefore waits it out again (on the safe side).
        if key != self._injected_key:
            self._injected_key = key
            self._injected_seen = time.monotonic()

    def _do(self, action: plan.Action, certs: CertSet | None) -> None:
        s = self.settings
        if action is plan.Action.CREATE:
            ca = generate_ca(validity=s.ca_validity)
            self._create(ca.cert_pem, ca, self._new_serving(ca))
            return
        if action is plan.Action.INJECT:
            assert certs is not None
            inject_ca_bundle(
                self.api,
                s.webhook_configuration,
                encode_bundle(certs.bundle),
                request_timeout=self.request_timeout,
            )
            return
        assert certs is not None
        if action is plan.Action.ROTATE_CA:
            new_ca = generate_ca(validity=s.ca_validity)
            rotation = bundle_with_new_ca(new_ca, certs.bundle, datetime.now(UTC))
            self._update(certs, rotation.bundle_pem, new_ca, certs.serving)
        elif action is plan.Action.RENEW:
            self._update(certs, encode_bundle(certs.bundle), certs.ca, self._new_serving(certs.ca))
        elif action is plan.Action.PRUNE:
            self._update(certs, certs.ca.cert_pem, certs.ca, certs.serving)

    def _new_serving(self, ca: KeyPair) -> KeyPair:
        s = self.settings
        return generate_serving(
            ca,
            s.service,
            self.namespace,
            extra_dns=s.dns_names,
            ip_addresses=s.ip_addresses,
            validity=s.validity,
            backdate=DEFAULT_BACKDATE,
        )

    def _body(self, bundle_pem: bytes, ca: KeyPair, serving: KeyPair, rv: str | None) -> Any:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode("ascii")

        return k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(
                name=self.settings.secret_name,
                namespace=self.namespace,
                resource_version=rv,
                labels={
                    "app.kubernetes.io/name": "holdwarden",
                    "app.kubernetes.io/component": "certificates",
                },
            ),
            type="kubernetes.io/tls",
            data={
                CA_BUNDLE: b64(bundle_pem),
                CA_KEY: b64(ca.key_pem),
                TLS_CERT: b64(serving.cert_pem),
                TLS_KEY: b64(serving.key_pem),
            },
        )

    def _create(self, bundle_pem: bytes, ca: KeyPair, serving: KeyPair) -> None:
        if not self.elector.is_leader():
            return
        try:
            self.core.create_namespaced_secret(
                self.namespace,
                self._body(bundle_pem, ca, serving, None),
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: another replica created it first; read it next
                raise

    def _update(self, certs: CertSet, bundle_pem: bytes, ca: KeyPair, serving: KeyPair) -> None:
        if not self.elector.is_leader():
            return
        try:
            # resourceVersion in the body: refused with 409 if the Secret changed since it
            # was read, and then decided again from a fresh read.
            self.core.replace_namespaced_secret(
                self.settings.secret_name,
                self.namespace,
                self._body(bundle_pem, ca, serving, certs.resource_version),
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    # -- on the event loop ----------------------------------------------------------------

    def _apply(self, snapshot: Snapshot) -> None:
        if snapshot.injected is not None or snapshot.error is None:
            self._injected = snapshot.injected
        self.last_error = snapshot.error
        self.synced = True
        certs = snapshot.certs
        if certs is None:
            return
        pems = (certs.serving.cert_pem, certs.serving.key_pem)
        if pems == self._served_pems:
            return
        cert_name, key_name = f"{self.where} key 'tls.crt'", f"{self.where} key 'tls.key'"
        try:
            cert = check_pair(*pems, datetime.now(UTC), cert_name, key_name)
            install_pair(self._context, *pems, cert_name, key_name)
        except ReloadError as exc:
            # Once per refused pair: the same bad Secret is seen again every interval.
            if pems != self._rejected_pems:
                self._rejected_pems = pems
                self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
                log.warning("self-managed certificates: not served: %s", exc)
            self.last_error = str(exc)
            return
        self._served = cert
        self._served_pems = pems
        log.info(
            "self-managed certificates: serving",
            extra={
                "fields": {
                    "fingerprint": fingerprint(cert),
                    "notAfter": cert.not_valid_after_utc.isoformat(),
                    "secret": self.where,
                }
            },
        )
