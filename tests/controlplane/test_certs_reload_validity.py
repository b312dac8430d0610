"""Hot reload never installs a pair that cannot be served: expired, not yet valid, or a key
that is not the certificate's. Each refusal is logged with its reason and counted once.

Before this, an expired pair on disk was installed and most handshakes then failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from holdwarden.certs.bundle import CA_BUNDLE, TLS_CERT, TLS_KEY
from holdwarden.certs.generate import KeyPair, generate_ca, generate_serving
from holdwarden.certs.reload import (
    EXPIRED,
    KEY_MISMATCH,
    MALFORMED,
    NOT_YET_VALID,
    ReloadError,
    ReloadingTLS,
)
from holdwarden.webhook.metrics import Metrics

SERVICE, NAMESPACE = "hw", "ns"
NOW = datetime.now(UTC)


def make_ca(now: datetime = NOW) -> KeyPair:
    # Made a month ago, so leaves can be issued in the past as well as the future.
    return generate_ca(now=now - timedelta(days=30))


def leaf(ca: KeyPair, *, starts: datetime, lasts: timedelta) -> KeyPair:
    return generate_serving(
        ca,
        SERVICE,
        NAMESPACE,
        ip_addresses=["127.0.0.1"],
        now=starts,
        validity=lasts,
        backdate=timedelta(0),
    )


def write_pair(directory: Path, pair: KeyPair, key_pem: bytes | None = None) -> None:
    # Replaced, not rewritten in place, so the change is seen even within one mtime tick.
    for name, data in ((TLS_CERT, pair.cert_pem), (TLS_KEY, key_pem or pair.key_pem)):
        scratch = directory / f".{name}.new"
        scratch.write_bytes(data)
        scratch.replace(directory / name)


@pytest.fixture
def cert_dir(tmp_path: Path) -> tuple[Path, KeyPair, KeyPair]:
    ca = make_ca()
    good = leaf(ca, starts=NOW - timedelta(hours=1), lasts=timedelta(days=30))
    (tmp_path / CA_BUNDLE).write_bytes(ca.cert_pem)
    write_pair(tmp_path, good)
    return tmp_path, ca, good


def bad_pairs(ca: KeyPair, good: KeyPair) -> list[tuple[str, KeyPair, bytes | None]]:
    expired = leaf(ca, starts=NOW - timedelta(days=10), lasts=timedelta(days=1))
    future = leaf(ca, starts=NOW + timedelta(days=2), lasts=timedelta(days=30))
    other = leaf(ca, starts=NOW - timedelta(hours=1), lasts=timedelta(days=30))
    return [
        (EXPIRED, expired, None),
        (NOT_YET_VALID, future, None),
        (KEY_MISMATCH, other, good.key_pem),  # a new certificate, the old key
    ]


@pytest.mark.parametrize("case", [EXPIRED, NOT_YET_VALID, KEY_MISMATCH])
def test_bad_pair_is_not_installed_logged_and_counted_once(
    cert_dir: tuple[Path, KeyPair, KeyPair], case: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory, ca, good = cert_dir
    tls = ReloadingTLS(directory / TLS_CERT, directory / TLS_KEY)
    metrics = Metrics()
    metrics.track_certificate_rejections(lambda: tls.rejected)
    reason, pair, key = next(c for c in bad_pairs(ca, good) if c[0] == case)
    write_pair(directory, pair, key)
    with caplog.at_level(logging.WARNING, logger="holdwarden.certs.reload"):
        for _ in range(5):  # the watcher checks every second; one rejection, not five
            assert tls.reload_if_changed() is False
    assert tls.loaded_fingerprint == good.fingerprint
    assert tls.not_after == good.not_after
    assert tls.rejected == {reason: 1}
    sample = metrics.registry.get_sample_value(
        "holdwarden_cert_reload_rejected_total", {"reason": reason}
    )
    assert sample == 1.0
    warnings = [r for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(warnings) == 1 and getattr(warnings[0], "fields", {})["reason"] == reason
    words = {EXPIRED: "expired", NOT_YET_VALID: "not valid yet", KEY_MISMATCH: "does not match"}
    assert words[reason] in (tls.last_error or "")
    # A good pair afterwards is installed, and the error clears.
    renewed = leaf(ca, starts=NOW - timedelta(hours=1), lasts=timedelta(days=60))
    write_pair(directory, renewed)
    assert tls.reload_if_changed() is True
    assert tls.loaded_fingerprint == renewed.fingerprint and tls.last_error is None


def test_each_new_bad_pair_counts(cert_dir: tuple[Path, KeyPair, KeyPair]) -> None:
    directory, ca, good = cert_dir
    tls = ReloadingTLS(directory / TLS_CERT, directory / TLS_KEY)
    for _, pair, key in bad_pairs(ca, good):
        write_pair(directory, pair, key)
        tls.reload_if_changed()
        tls.reload_if_changed()
    (directory / TLS_KEY).write_bytes(b"-----BEGIN PRIVATE KEY-----\ntorn")
    tls.reload_if_changed()
    assert tls.rejected == {EXPIRED: 1, NOT_YET_VALID: 1, KEY_MISMATCH: 1, MALFORMED: 1}
    assert tls.loaded_fingerprint == good.fingerprint and tls.reloads == 0


def test_not_yet_valid_pair_is_installed_once_its_time_comes(
    cert_dir: tuple[Path, KeyPair, KeyPair],
) -> None:
    directory, ca, _ = cert_dir
    clock = [NOW]
    tls = ReloadingTLS(directory / TLS_CERT, directory / TLS_KEY, clock=lambda: clock[0])
    future = leaf(ca, starts=NOW + timedelta(minutes=10), lasts=timedelta(days=30))
    write_pair(directory, future)
    assert tls.reload_if_changed() is False and tls.rejected == {NOT_YET_VALID: 1}
    clock[0] = NOW + timedelta(minutes=11)  # no file changed, only the time
    assert tls.reload_if_changed() is True
    assert tls.loaded_fingerprint == future.fingerprint


def test_the_served_pair_expiring_on_the_clock_is_caught_at_reload(
    cert_dir: tuple[Path, KeyPair, KeyPair],
) -> None:
    # The clock says a renewal written by a machine with a wrong clock is already expired.
    directory, ca, good = cert_dir
    clock = [NOW]
    tls = ReloadingTLS(directory / TLS_CERT, directory / TLS_KEY, clock=lambda: clock[0])
    short = leaf(ca, starts=NOW - timedelta(hours=1), lasts=timedelta(hours=2))
    clock[0] = NOW + timedelta(hours=3)
    write_pair(directory, short)
    assert tls.reload_if_changed() is False and tls.rejected == {EXPIRED: 1}
    assert tls.loaded_fingerprint == good.fingerprint


@pytest.mark.parametrize("case", [EXPIRED, NOT_YET_VALID, KEY_MISMATCH])
def test_first_load_refuses_a_bad_pair(tmp_path: Path, case: str) -> None:
    ca = make_ca()
    good = leaf(ca, starts=NOW - timedelta(hours=1), lasts=timedelta(days=30))
    _, pair, key = next(c for c in bad_pairs(ca, good) if c[0] == case)
    write_pair(tmp_path, pair, key)
    with pytest.raises(ReloadError) as caught:
        ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)
    assert caught.value.reason == case


@contextlib.asynccontextmanager
async def https(tls: ReloadingTLS) -> AsyncIterator[int]:
    async def ping(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    app = web.Application()
    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.ssl_context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def handshake(port: int, trust: Path) -> str:
    """One verified TLS connection; the served certificate's SHA-256."""
    context = ssl.create_default_context(cafile=str(trust))
    async with asyncio.timeout(10):
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1)
    return hashlib.sha256(der).hexdigest()


async def test_handshakes_keep_succeeding_while_an_expired_pair_is_on_disk(
    cert_dir: tuple[Path, KeyPair, KeyPair],
) -> None:
    async with asyncio.timeout(60):
        directory, ca, good = cert_dir
        tls = ReloadingTLS(directory / TLS_CERT, directory / TLS_KEY)
        watcher = asyncio.create_task(tls.watch(0.01))
        try:
            async with https(tls) as port:
                assert await handshake(port, directory / CA_BUNDLE) == good.fingerprint
                expired = leaf(ca, starts=NOW - timedelta(days=10), lasts=timedelta(days=1))
                write_pair(directory, expired)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 15
                while tls.rejected.get(EXPIRED, 0) == 0:
                    assert loop.time() < deadline, "the watcher never looked at the new pair"
                    await asyncio.sleep(0.01)
                served = [await handshake(port, directory / CA_BUNDLE) for _ in range(20)]
                assert served == [good.fingerprint] * 20  # every handshake verified
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
