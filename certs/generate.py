"""Make the enforcer's certificates: a CA, serving certificates and client certificates.

Pure functions over the ``cryptography`` library: no files, no clock unless ``now`` is
left out. Every key is ECDSA P-256 and every signature ECDSA with SHA-256.

Invariants:
  - a CA is ``CA:TRUE, pathlen:0`` (it signs leaves only), with keyCertSign + cRLSign;
  - a serving certificate names exactly ``svc``, ``svc.ns``, ``svc.ns.svc`` plus the
    extra DNS names and IP addresses asked for, is serverAuth only, and is signed by the CA
    it was given (AuthorityKeyIdentifier = the CA's SubjectKeyIdentifier);
  - ``notBefore`` is backdated (clock skew between this machine and the apiserver), never
    before the CA's own ``notBefore``; a leaf never outlives its CA: asking for that is a
    ``ValueError`` that names the ``--validity`` flag.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_CA_VALIDITY = timedelta(days=3650)
DEFAULT_LEAF_VALIDITY = timedelta(days=365)
DEFAULT_BACKDATE = timedelta(hours=1)
DEFAULT_CA_COMMON_NAME = "holdwarden-ca"
_MAX_COMMON_NAME = 64

# RFC 1123 label, as Kubernetes requires of namespace names (service names are stricter).
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME_LABEL_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    @cached_property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @cached_property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("holdwarden keys are ECDSA; this key is not")
        return key

    @property
    def not_before(self) -> datetime:
        return self.certificate.not_valid_before_utc

    @property
    def not_after(self) -> datetime:
        """The end of validity, timezone-aware UTC."""
        return self.certificate.not_valid_after_utc

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the certificate's DER, lowercase hex."""
        return fingerprint(self.certificate)


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of ``cert``'s DER encoding, lowercase hex with no separators."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def generate_ca(
    common_name: str = DEFAULT_CA_COMMON_NAME,
    validity: timedelta = DEFAULT_CA_VALIDITY,
    backdate: timedelta = DEFAULT_BACKDATE,
    now: datetime | None = None,
) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only (``pathlen:0``)."""
    if not 0 < len(common_name) <= _MAX_COMMON_NAME:
        raise ValueError(f"the CA common name must be 1 to {_MAX_COMMON_NAME} characters")
    start, end = _window(validity, backdate, now, "--ca-validity")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return _sign(builder, key, key)


def generate_serving(
    ca: KeyPair,
    service: str,
    namespace: str,
    *,
    extra_dns: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    backdate: timedelta = DEFAULT_BACKDATE,
    now: datetime | None = None,
) -> KeyPair:
    """A serverAuth certificate for Service ``service`` in ``namespace``, signed by ``ca``."""
    _check_label(service, "service")
    _check_label(namespace, "namespace")
    names = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    for dns in extra_dns:
        _check_dns_name(dns)
        if dns not in names:
            names.append(dns)
    ips = [_parse_ip(ip) for ip in ip_addresses]
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ip) for ip in dict.fromkeys(ips)]
    # X.509 caps a CommonName at 64 characters; clients match the SANs, the CN is only a
    # label, so take the most specific service name that fits (``service`` always does).
    common_name = next(n for n in reversed(names[:3]) if len(n) <= _MAX_COMMON_NAME)
    return _leaf(
        ca,
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
        sans=sans,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        validity=validity,
        backdate=backdate,
        now=now,
    )


def generate_client(
    ca: KeyPair,
    common_name: str,
    organizations: Sequence[str] = (),
    *,
    validity: timedelta = DEFAULT_LEAF_VALIDITY,
    backdate: timedelta = DEFAULT_BACKDATE,
    now: datetime | None = None,
) -> KeyPair:
    """A clientAuth certificate; Kubernetes reads CN as the user and each O as a group."""
    if not 0 < len(common_name) <= _MAX_COMMON_NAME:
        raise ValueError(
            f"a client certificate needs a common name (the user name), "
            f"1 to {_MAX_COMMON_NAME} characters"
        )
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return _leaf(
        ca,
        subject=x509.Name(attributes),
        sans=[],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        validity=validity,
        backdate=backdate,
        now=now,
    )


def _leaf(
    ca: KeyPair,
    *,
    subject: x509.Name,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    validity: timedelta,
    backdate: timedelta,
    now: datetime | None,
) -> KeyPair:
    ca_cert = ca.certificate
    constraints = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    if not constraints.ca:
        raise ValueError("the signing certificate is not a CA")
    start, end = _window(validity, backdate, now, "--validity")
    # Backdating must not reach before the CA exists: the chain would not verify then.
    start = max(start, ca.not_before)
    if end > ca.not_after:
        raise ValueError(
            f"--validity {_days(validity)} would outlive the CA, which expires "
            f"{ca.not_after.isoformat()}; shorten --validity or rotate the CA first"
        )
    if start >= end:
        raise ValueError("the CA is not valid yet at this time; check the clock")
    key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _sign(builder, key, ca.private_key)


def _window(
    validity: timedelta, backdate: timedelta, now: datetime | None, flag: str
) -> tuple[datetime, datetime]:
    if validity <= timedelta(0):
        raise ValueError(f"{flag} must be longer than zero")
    if backdate < timedelta(0):
        raise ValueError("the backdate must not be negative")
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        raise ValueError("'now' must be timezone-aware")
    # X.509 times have whole seconds; drop the rest so what we ask for is what we get.
    now = now.astimezone(UTC).replace(microsecond=0)
    return now - backdate, now + validity


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _sign(
    builder: x509.CertificateBuilder,
    key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey,
) -> KeyPair:
    cert = builder.sign(signer, hashes.SHA256())
    return KeyPair(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _check_label(value: str, what: str) -> None:
    if _DNS_LABEL_RE.fullmatch(value) is None:
        raise ValueError(
            f"{what} {value!r} is not a DNS label (lowercase letters, digits and '-', "
            "1-63 characters, starting and ending with a letter or digit)"
        )


def _check_dns_name(value: str) -> None:
    labels = value.split(".")
    if len(value) > 253 or not all(_DNS_NAME_LABEL_RE.fullmatch(label) for label in labels):
        raise ValueError(f"--dns {value!r} is not a DNS name such as 'webhook.example.com'")


def _parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"--ip {value!r} is not an IP address such as 127.0.0.1") from None


def _days(delta: timedelta) -> str:
    if delta % timedelta(days=1) == timedelta(0):
        return f"{delta.days}d"
    return str(delta)
