"""The certificate directory and atomic writes of its files.

A cert dir holds (the names a ``kubernetes.io/tls`` Secret uses, plus the CA key):

  ``ca.crt``   the CA bundle: one or more CA certificates, PEM, concatenated, newest first
  ``ca.key``   the private key of the current CA (the one that signs new serving certs)
  ``tls.crt``  the serving certificate (PEM)
  ``tls.key``  its private key (PEM, PKCS#8)

Invariants: every file is replaced atomically (a reader sees the old file or the new one,
never a mix: temporary file in the same directory, fsync, ``os.replace``, fsync of the
directory); private keys are mode 0600 from the moment they exist.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from holdwarden.certs.generate import KeyPair

CA_BUNDLE = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

KEY_MODE = 0o600
CERT_MODE = 0o644


class CertDirError(ValueError):
    """A cert dir file is missing or unreadable; the message names the file."""


@dataclass(frozen=True)
class CertDir:
    """What a cert dir holds, loaded and cross-checked."""

    path: Path
    bundle_pem: bytes
    bundle: tuple[x509.Certificate, ...]
    ca: KeyPair
    serving: KeyPair


def write_cert_dir(
    directory: str | Path, ca: KeyPair, serving: KeyPair, bundle: bytes | None = None
) -> None:
    """Write all four files; ``bundle`` defaults to the CA certificate alone.

    Order matters for a server that watches the directory: the bundle first (so it can be
    handed to clients before the server switches), then the CA key, then the serving
    key and certificate.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    bundle_pem = bundle if bundle is not None else ca.cert_pem
    if not parse_bundle(bundle_pem):
        raise CertDirError("the CA bundle holds no certificate")
    atomic_write(path / CA_BUNDLE, bundle_pem, CERT_MODE)
    atomic_write(path / CA_KEY, ca.key_pem, KEY_MODE)
    write_serving(path, serving)


def write_serving(directory: str | Path, serving: KeyPair) -> None:
    """Replace ``tls.key`` then ``tls.crt`` (each atomically).

    Between the two replacements a reader sees a new key with the old certificate; a
    reloading server must (and ``holdwarden.certs.reload`` does) check the pair before using it.
    """
    path = Path(directory)
    atomic_write(path / TLS_KEY, serving.key_pem, KEY_MODE)
    atomic_write(path / TLS_CERT, serving.cert_pem, CERT_MODE)


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` so that readers never see a partial file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; set the final mode before any byte is written.
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_bundle(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle, in order; ``[]`` if it holds none."""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        return []
    try:
        return list(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise CertDirError(f"not a PEM certificate bundle: {exc}") from None


def encode_bundle(certs: Sequence[x509.Certificate]) -> bytes:
    """Concatenate certificates as PEM, in the order given."""
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def load_cert_dir(directory: str | Path) -> CertDir:
    """Load a cert dir, checking that each key matches its certificate.

    The CA certificate is the one in the bundle whose public key matches ``ca.key``.
    """
    path = Path(directory)
    bundle_pem = _read(path / CA_BUNDLE)
    ca_key_pem = _read(path / CA_KEY)
    serving = KeyPair(_read(path / TLS_CERT), _read(path / TLS_KEY))
    bundle, ca = check_cert_set(bundle_pem, ca_key_pem, serving, lambda name: str(path / name))
    return CertDir(path=path, bundle_pem=bundle_pem, bundle=bundle, ca=ca, serving=serving)


def check_cert_set(
    bundle_pem: bytes, ca_key_pem: bytes, serving: KeyPair, where: Callable[[str], str]
) -> tuple[tuple[x509.Certificate, ...], KeyPair]:
    """The bundle and the current CA of a cert set, each key checked against its certificate.

    The same checks whether the four parts come from a directory or a Secret; ``where``
    names a part (``ca.crt``, ...) in error messages. Raises ``CertDirError``.
    """
    bundle = parse_bundle(bundle_pem)
    if not bundle:
        raise CertDirError(f"{where(CA_BUNDLE)} holds no certificate")
    try:
        ca_public = _public_der(KeyPair(b"", ca_key_pem))
    except ValueError as exc:
        raise CertDirError(f"{where(CA_KEY)} is not a private key: {exc}") from None
    matching = [c for c in bundle if _cert_public_der(c) == ca_public]
    if not matching:
        raise CertDirError(f"{where(CA_KEY)} does not belong to any CA in {where(CA_BUNDLE)}")
    ca = KeyPair(matching[0].public_bytes(serialization.Encoding.PEM), ca_key_pem)
    try:
        serving_cert_public = _cert_public_der(serving.certificate)
        serving_key_public = _public_der(serving)
    except ValueError as exc:
        raise CertDirError(f"{where(TLS_CERT)} or {where(TLS_KEY)} is unreadable: {exc}") from None
    if serving_cert_public != serving_key_public:
        raise CertDirError(f"{where(TLS_KEY)} does not match {where(TLS_CERT)}")
    return tuple(bundle), ca


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertDirError(f"{path} does not exist") from None
    except OSError as exc:
        raise CertDirError(f"cannot read {path}: {exc.strerror}") from None


def _public_der(pair: KeyPair) -> bytes:
    return pair.private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _cert_public_der(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
