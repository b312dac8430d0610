"""Hot reload of the serving certificate, without a restart and without a failed handshake.

Usage (the enforcer)::

    tls = ReloadingTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
    site = web.TCPSite(runner, host, port, ssl_context=tls.ssl_context)
    asyncio.create_task(tls.watch())

Invariants:
  - there is exactly one live ``ssl.SSLContext`` (TLS >= 1.2), created once; reloading
    changes what it serves, never which object aiohttp holds;
  - the live context is only ever given a pair that has just loaded cleanly into a scratch
    context, from the very same bytes (an in-memory copy), so a half-written file, a key
    that does not match its certificate or an unreadable file is ignored and the current
    certificate keeps being served;
  - nor is it ever given a certificate that is expired or not yet valid (by ``clock``), or
    whose public key is not the private key's: every handshake with it would fail. Each
    refused pair is logged with its reason and counted once in ``rejected[reason]``
    (reasons: ``REJECT_REASONS``), however many checks see it again;
  - ``reload_if_changed`` never raises for a bad pair on disk (it keeps serving the old
    one and reports ``last_error``);
  - ``watch`` never ends on an error (it logs it and tries again); only cancellation stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from holdwarden.certs.generate import fingerprint

log = logging.getLogger("holdwarden.certs.reload")


@dataclass(frozen=True)
class _Stamp:
    """What ``stat`` says about the pair; a change means "look at the contents"."""

    cert: tuple[int, int, int, int]
    key: tuple[int, int, int, int]


@dataclass(frozen=True)
class _Loaded:
    digest: str
    fingerprint: str
    not_after: datetime


# Why a pair was not installed: the label values of holdwarden_cert_reload_rejected_total.
UNREADABLE = "unreadable"  # missing or unreadable files
MALFORMED = "malformed"  # not a PEM certificate or private key (e.g. half-written)
KEY_MISMATCH = "key-mismatch"  # the key is not the certificate's
EXPIRED = "expired"
NOT_YET_VALID = "not-yet-valid"
UNUSABLE = "unusable"  # OpenSSL refused the pair for another reason
REJECT_REASONS = (UNREADABLE, MALFORMED, KEY_MISMATCH, EXPIRED, NOT_YET_VALID, UNUSABLE)


class ReloadError(Exception):
    """The certificate/key pair on disk cannot be served; the message says why and
    ``reason`` is one of ``REJECT_REASONS``."""

    def __init__(self, message: str, reason: str = UNUSABLE, digest: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.digest = digest  # of the refused contents ("" when they could not be read)


class ReloadingTLS:
    """A server ``SSLContext`` whose certificate follows the files on disk."""

    def __init__(
        self,
        cert_path: str | Path,
        key_path: str | Path,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Load the pair now; a pair that cannot be served raises ``ReloadError``."""
        self.cert_path = Path(cert_path)
        self.key_path = Path(key_path)
        self.clock = clock
        self.rejected: dict[str, int] = {}
        self._last_rejection: tuple[str, str] | None = None
        self._context = _new_context()
        self._stamp: _Stamp | None = None
        stamp = self._stat()
        cert_pem, key_pem = self._read()
        self._loaded = self._install(cert_pem, key_pem)
        self._stamp = stamp
        self.reloads = 0
        self.last_error: str | None = None

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The one live context; hand it to aiohttp once."""
        return self._context

    @property
    def not_after(self) -> datetime:
        """When the certificate being served expires (UTC), for the expiry metric."""
        return self._loaded.not_after

    @property
    def loaded_fingerprint(self) -> str:
        """SHA-256 (hex) of the certificate being served."""
        return self._loaded.fingerprint

    def reload_if_changed(self) -> bool:
        """Serve the pair on disk if it changed and is good; True if the served pair changed.

        A changed pair that cannot be served (half-written, mismatched, unreadable) is
        ignored: the old pair is still served, ``last_error`` says why (logged once), and
        the next call looks again, so a pair caught between its two writes is picked up
        once the second file lands.
        """
        try:
            changed = self._reload()
        except ReloadError as exc:
            self._reject(exc)
            return False
        self.last_error = None
        self._last_rejection = None
        return changed

    def _reject(self, exc: ReloadError) -> None:
        # Once per refused pair: the watcher sees the same bad files every second until
        # they are fixed, and that is one rejection, not one a second.
        seen = (exc.reason, exc.digest or str(exc))
        if seen != self._last_rejection:
            self._last_rejection = seen
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
            log.warning(
                "serving certificate not reloaded: %s",
                exc,
                extra={"fields": {"reason": exc.reason, "certFile": str(self.cert_path)}},
            )
        self.last_error = str(exc)

    async def watch(self, interval: float = 1.0) -> None:
        """Check the files every ``interval`` seconds, forever; errors are logged, not raised.

        The check runs on the event loop thread, on purpose: see ``_install``.
        """
        while True:
            try:
                self.reload_if_changed()
            except Exception:
                log.exception("unexpected error while checking the serving certificate")
            await asyncio.sleep(interval)

    def _reload(self) -> bool:
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        cert_pem, key_pem = self._read()
        if _digest(cert_pem, key_pem) == self._loaded.digest:
            # Touched or re-linked (a Secret volume update) with the same contents.
            self._stamp = stamp
            return False
        self._loaded = self._install(cert_pem, key_pem)
        self._stamp = stamp
        self.reloads += 1
        log.info(
            "serving certificate reloaded",
            extra={
                "fields": {"fingerprint": self._loaded.fingerprint, "notAfter": str(self.not_after)}
            },
        )
        return True

    # -- internals -------------------------------------------------------------------

    def _stat(self) -> _Stamp:
        try:
            return _Stamp(_stat_tuple(self.cert_path), _stat_tuple(self.key_path))
        except OSError as exc:
            raise ReloadError(f"cannot stat the certificate files: {exc}", UNREADABLE) from None

    def _read(self) -> tuple[bytes, bytes]:
        try:
            return self.cert_path.read_bytes(), self.key_path.read_bytes()
        except OSError as exc:
            raise ReloadError(f"cannot read the certificate files: {exc}", UNREADABLE) from None

    def _check(self, cert_pem: bytes, key_pem: bytes) -> x509.Certificate:
        """The certificate, if the pair may be served now; otherwise ``ReloadError``."""
        return check_pair(cert_pem, key_pem, self.clock(), str(self.cert_path), str(self.key_path))

    def _install(self, cert_pem: bytes, key_pem: bytes) -> _Loaded:
        try:
            cert = self._check(cert_pem, key_pem)
        except ReloadError as exc:
            if self._stamp is None:  # the first load: counted as well, then raised
                self._reject(exc)
            raise
        install_pair(self._context, cert_pem, key_pem, str(self.cert_path), str(self.key_path))
        return _Loaded(
            digest=_digest(cert_pem, key_pem),
            fingerprint=fingerprint(cert),
            not_after=cert.not_valid_after_utc,
        )


def check_pair(
    cert_pem: bytes, key_pem: bytes, now: datetime, cert_name: str, key_name: str
) -> x509.Certificate:
    """The certificate, if the pair may be served at ``now``; otherwise ``ReloadError``.

    ``cert_name`` and ``key_name`` say where the two came from (files, a Secret's keys).
    """
    digest = _digest(cert_pem, key_pem)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ReloadError(
            f"{cert_name} is not a PEM certificate: {exc}", MALFORMED, digest
        ) from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ReloadError(
            f"{key_name} is not an unencrypted PEM private key: {exc}", MALFORMED, digest
        ) from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise ReloadError(
            f"{cert_name} and {key_name} are not a usable pair: the key does "
            f"not match the certificate",
            KEY_MISMATCH,
            digest,
        )
    if now < cert.not_valid_before_utc:
        raise ReloadError(
            f"{cert_name} is not valid yet: notBefore "
            f"{cert.not_valid_before_utc.isoformat()} is after now ({now.isoformat()}); "
            f"check the clocks of this machine and of the one that made it",
            NOT_YET_VALID,
            digest,
        )
    if now > cert.not_valid_after_utc:
        raise ReloadError(
            f"{cert_name} has expired: notAfter "
            f"{cert.not_valid_after_utc.isoformat()} is before now ({now.isoformat()}); "
            f"renew it (holdwarden certs renew)",
            EXPIRED,
            digest,
        )
    return cert


def install_pair(
    context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, cert_name: str, key_name: str
) -> None:
    """Load a checked pair into the live ``context``, via a scratch context first, so a
    pair OpenSSL refuses raises ``ReloadError`` and leaves ``context`` as it was.
    Call it on the event loop thread (see the comment below)."""
    with _memory_file(cert_pem) as cert_file, _memory_file(key_pem) as key_file:
        scratch = _new_context()
        try:
            scratch.load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ReloadError(
                f"{cert_name} and {key_name} are not a usable pair: {exc}",
                UNUSABLE,
                _digest(cert_pem, key_pem),
            ) from None
        # Same bytes as just validated, so this cannot fail half-way and leave the
        # live context with a certificate but no matching key. Safe to do in place:
        # OpenSSL copies the context's certificate and key into each connection when
        # the connection is created (SSL_new), so connections already open keep what
        # they have; and under asyncio every SSL object is created by the event loop
        # thread, the same thread that runs this, so no handshake can start between
        # the certificate and the key being replaced.
        context.load_cert_chain(cert_file, key_file)


def _new_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _stat_tuple(path: Path) -> tuple[int, int, int, int]:
    # stat follows symlinks: a Secret volume swaps its ..data link, which changes the inode.
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _digest(cert_pem: bytes, key_pem: bytes) -> str:
    h = hashlib.sha256()
    for part in (cert_pem, key_pem):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path with exactly ``data``, for ``load_cert_chain`` (which only takes paths).

    Linux: an anonymous in-memory file (memfd), so no private key touches a disk and a
    read-only root filesystem is fine. Elsewhere: a 0600 temporary file, removed at once.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("holdwarden-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    handle = tempfile.NamedTemporaryFile(delete=False)  # noqa: SIM115  # closed below
    try:
        handle.write(data)
        handle.close()
        yield handle.name
    finally:
        os.unlink(handle.name)
