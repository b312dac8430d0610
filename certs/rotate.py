"""Rotation with overlap: a new CA joins the bundle before anything is signed by it.

The procedure (docs/how-to/certificates.md) in terms of these functions:

  1. ``rotate_ca``: new CA; ``ca.crt`` = new CA + every still-valid old CA; new ``ca.key``.
     The serving certificate is untouched, so nothing changes for clients yet.
  2. inject ``ca.crt`` into the webhook configuration: clients now trust old and new.
  3. ``renew_serving``: a serving certificate from the (new) CA; the server hot-reloads it.
  4. once every client has the new bundle, ``prune`` drops the old CAs.

``rotate`` does 1 and 3 in one go (bundle first, then the serving pair). That is right
when the directory is a staging copy and step 2 happens before the Secret the server
reads is updated; when a server watches the directory itself, use 1, 2, 3 separately.

Invariants: the bundle always contains the CA that signed the serving certificate on
disk; an expired CA is never kept; ``prune`` refuses while the serving certificate is
not from the current CA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from holdwarden.certs.bundle import (
    CA_BUNDLE,
    CA_KEY,
    CERT_MODE,
    KEY_MODE,
    CertDirError,
    atomic_write,
    encode_bundle,
    load_cert_dir,
    write_serving,
)
from holdwarden.certs.generate import (
    DEFAULT_BACKDATE,
    DEFAULT_CA_COMMON_NAME,
    DEFAULT_CA_VALIDITY,
    DEFAULT_LEAF_VALIDITY,
    KeyPair,
    fingerprint,
    generate_ca,
    generate_serving,
)


@dataclass(frozen=True)
class CARotation:
    """The outcome of ``rotate_ca``: the new CA, the bundle written, and old CAs' fate."""

    ca: KeyPair
    bundle_pem: bytes
    kept: tuple[x509.Certificate, ...]
    dropped: tuple[x509.Certificate, ...]


@dataclass(frozen=True)
class Rotation:
    """The outcome of ``rotate``."""

    ca: CARotation
    serving: KeyPair


def rotate_ca(
    directory: str | Path,
    *,
    common_name: str = DEFAULT_CA_COMMON_NAME,
    ca_validity: timedelta = DEFAULT_CA_VALIDITY,
    backdate: timedelta = DEFAULT_BACKDATE,
    now: datetime | None = None,
) -> CARotation:
    """Put a new CA first in the bundle, keep the old ones still valid, drop the expired.

    Writes ``ca.crt`` before ``ca.key``: at every moment the bundle holds the CA of
    ``ca.key`` and of ``tls.crt``.
    """
    now = _now(now)
    current = load_cert_dir(directory)
    new_ca = generate_ca(common_name, validity=ca_validity, backdate=backdate, now=now)
    rotation = bundle_with_new_ca(new_ca, current.bundle, now)
    path = Path(directory)
    atomic_write(path / CA_BUNDLE, rotation.bundle_pem, CERT_MODE)
    atomic_write(path / CA_KEY, new_ca.key_pem, KEY_MODE)
    return rotation


def bundle_with_new_ca(
    new_ca: KeyPair, bundle: Sequence[x509.Certificate], now: datetime
) -> CARotation:
    """The bundle after a CA rotation, computed only: ``new_ca`` first, then each old CA
    still valid at ``now`` (once each), the expired ones dropped."""
    kept: list[x509.Certificate] = []
    dropped: list[x509.Certificate] = []
    seen = {new_ca.fingerprint}
    for cert in bundle:
        if fingerprint(cert) in seen:
            continue
        seen.add(fingerprint(cert))
        (kept if cert.not_valid_after_utc > now else dropped).append(cert)
    bundle_pem = encode_bundle([new_ca.certificate, *kept])
    return CARotation(ca=new_ca, bundle_pem=bundle_pem, kept=tuple(kept), dropped=tuple(dropped))


def renew_serving(
    directory: str | Path,
    service: str,
    namespace: str,
    *,
    extra_dns: Sequence[str] | None = None,
    ip_addresses: Sequence[str] | None = None,
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    backdate: timedelta = DEFAULT_BACKDATE,
    now: datetime | None = None,
) -> KeyPair:
    """A new serving certificate from the directory's current CA, written key then cert.

    ``extra_dns`` / ``ip_addresses`` left as ``None`` keep those of the current serving
    certificate (beyond the three service names), so a renewal does not lose e.g. the
    ``127.0.0.1`` a local setup needs.
    """
    current = load_cert_dir(directory)
    old_dns, old_ips = _extra_names(current.serving.certificate, service, namespace)
    serving = generate_serving(
        current.ca,
        service,
        namespace,
        extra_dns=old_dns if extra_dns is None else extra_dns,
        ip_addresses=old_ips if ip_addresses is None else ip_addresses,
        validity=validity,
        backdate=backdate,
        now=_now(now),
    )
    write_serving(directory, serving)
    return serving


def rotate(
    directory: str | Path,
    service: str,
    namespace: str,
    *,
    extra_dns: Sequence[str] | None = None,
    ip_addresses: Sequence[str] | None = None,
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    ca_validity: timedelta = DEFAULT_CA_VALIDITY,
    ca_common_name: str = DEFAULT_CA_COMMON_NAME,
    backdate: timedelta = DEFAULT_BACKDATE,
    now: datetime | None = None,
) -> Rotation:
    """``rotate_ca`` then ``renew_serving``: bundle first, then the serving key and cert."""
    now = _now(now)
    # Check the serving arguments before anything is written.
    generate_serving(
        generate_ca(validity=ca_validity, now=now),
        service,
        namespace,
        extra_dns=extra_dns or (),
        ip_addresses=ip_addresses or (),
        validity=validity,
        now=now,
    )
    ca = rotate_ca(
        directory, common_name=ca_common_name, ca_validity=ca_validity, backdate=backdate, now=now
    )
    serving = renew_serving(
        directory,
        service,
        namespace,
        extra_dns=extra_dns,
        ip_addresses=ip_addresses,
        validity=validity,
        backdate=backdate,
        now=now,
    )
    return Rotation(ca=ca, serving=serving)


def prune(directory: str | Path) -> tuple[x509.Certificate, ...]:
    """Drop every CA but the current one from the bundle; return the dropped ones.

    Run it only after every client has the new bundle. Refused while ``tls.crt`` is not
    signed by the current CA (the server would become untrusted).
    """
    current = load_cert_dir(directory)
    try:
        current.serving.certificate.verify_directly_issued_by(current.ca.certificate)
    except (ValueError, TypeError, InvalidSignature):
        raise CertDirError(
            f"{Path(directory) / 'tls.crt'} is not signed by the current CA; "
            "renew the serving certificate before pruning old CAs"
        ) from None
    keep = current.ca.certificate
    dropped = tuple(c for c in current.bundle if fingerprint(c) != fingerprint(keep))
    if dropped:
        atomic_write(
            Path(directory) / CA_BUNDLE, keep.public_bytes(serialization.Encoding.PEM), CERT_MODE
        )
    return dropped


def _extra_names(
    cert: x509.Certificate, service: str, namespace: str
) -> tuple[list[str], list[str]]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    standard = {service, f"{service}.{namespace}", f"{service}.{namespace}.svc"}
    dns = [n for n in sans.get_values_for_type(x509.DNSName) if n not in standard]
    ips = [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    return dns, ips


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("'now' must be timezone-aware")
    return now
