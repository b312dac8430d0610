"""holdwarden.certs.reload: a real aiohttp TLS server swaps its certificate under load, no restart.

Clients make a new TCP+TLS connection per request and verify the server against the CA
bundle on disk, the way the apiserver verifies a webhook against its caBundle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from holdwarden.certs.bundle import CA_BUNDLE, TLS_CERT, TLS_KEY, load_cert_dir, write_cert_dir
from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.reload import ReloadError, ReloadingTLS
from holdwarden.certs.rotate import prune, renew_serving, rotate, rotate_ca

SERVICE, NAMESPACE = "hw", "ns"
WATCH_INTERVAL = 0.02
CLIENTS = 4
REQUEST_BUDGET = 10.0  # seconds for one request, connect to close
STOP_BUDGET = 15.0  # seconds for the clients and the watcher to stop


@dataclass
class Load:
    """Concurrent HTTPS clients; each request is a new connection, verified against ``trust``."""

    port: int
    trust: Path
    counts: list[int] = field(default_factory=lambda: [0] * CLIENTS)
    failures: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # served fingerprints, in order
    # The clients stop on this flag, not on cancellation alone: a cancel that lands inside
    # a library call (wait_for racing a finished read, an SSL shutdown) can be swallowed,
    # and a client that loops on after it would keep the test alive for ever.
    stopping: bool = False

    async def request(self) -> str:
        context = ssl.create_default_context(cafile=str(self.trust))
        # One budget for the whole request, drain and close included.
        async with asyncio.timeout(REQUEST_BUDGET):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=context)
            try:
                der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
                writer.write(b"GET /ping HTTP/1.1\r\nHost: hw\r\nConnection: close\r\n\r\n")
                await writer.drain()
                answer = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), timeout=1)
        if not (answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"pong")):
            raise AssertionError(f"unexpected answer {answer[:80]!r}")
        return hashlib.sha256(der).hexdigest()

    async def client(self, index: int) -> None:
        while not self.stopping:
            try:
                served = await self.request()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures.append(f"client {index}: {exc!r}")
            else:
                if not self.seen or self.seen[-1] != served:
                    self.seen.append(served)
                self.counts[index] += 1
            await asyncio.sleep(0)

    async def progress(self, requests: int = 2) -> None:
        """Wait until every client has completed ``requests`` more requests.

        A request that completes after this returns started after it was called, so it
        used the trust file and the served certificate as they are now.
        """
        target = [c + requests for c in self.counts]
        await wait_until(
            lambda: all(c >= t for c, t in zip(self.counts, target, strict=True)),
            why=lambda: f"clients stalled; last failures: {self.failures[-3:]}",
        )


async def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 15.0,
    why: Callable[[], str] = lambda: "timed out waiting for a condition",
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(why())
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def serving(tls: ReloadingTLS, trust: Path) -> AsyncIterator[Load]:
    """An aiohttp HTTPS server on 127.0.0.1 with ``tls``, its watcher, and clients."""

    async def ping(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    app = web.Application()
    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    watcher = asyncio.create_task(tls.watch(WATCH_INTERVAL))
    load = Load(port=port, trust=trust)
    clients = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
    try:
        await load.progress(3)
        yield load
    finally:
        load.stopping = True
        watcher.cancel()
        # Bounded: a client finishes its request (at most REQUEST_BUDGET) and sees the flag.
        _, pending = await asyncio.wait([*clients, watcher], timeout=STOP_BUDGET)
        for task in pending:
            task.cancel()
        if pending:
            _, still = await asyncio.wait(pending, timeout=2)
            load.failures.append(
                f"{len(pending)} task(s) did not stop, {len(still)} ignored cancel"
            )
        await asyncio.wait_for(runner.cleanup(), timeout=STOP_BUDGET)


def new_cert_dir(path: Path) -> None:
    ca = generate_ca()
    write_cert_dir(path, ca, generate_serving(ca, SERVICE, NAMESPACE, ip_addresses=["127.0.0.1"]))


async def test_rotate_ca_and_serving_cert_under_load_with_zero_failures(tmp_path: Path) -> None:
    new_cert_dir(tmp_path)
    tls = ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)
    served = [tls.loaded_fingerprint]
    async with serving(tls, tmp_path / CA_BUNDLE) as load:
        for cycle in range(3):
            # 1. new CA into the bundle (old kept); 2. clients pick up the bundle.
            staged = rotate_ca(tmp_path)
            await load.progress()
            # 3. new serving cert from the new CA; the server reloads it.
            new = renew_serving(tmp_path, SERVICE, NAMESPACE)
            served.append(new.fingerprint)
            await wait_until(lambda: tls.loaded_fingerprint == served[-1])
            await load.progress()
            assert new.certificate.issuer == staged.ca.certificate.subject
            if cycle == 1:
                # 4. every client has the new bundle: drop the old CAs.
                assert len(prune(tmp_path)) == 2
                await load.progress()
        # A renewal from the same CA, too.
        served.append(renew_serving(tmp_path, SERVICE, NAMESPACE).fingerprint)
        await wait_until(lambda: tls.loaded_fingerprint == served[-1])
        await load.progress()
    assert load.failures == []
    assert load.seen == served  # every certificate was served, in order, and only those
    assert tls.reloads == 4
    assert tls.not_after == load_cert_dir(tmp_path).serving.not_after
    assert sum(load.counts) >= 12 * CLIENTS


def _secret_volume_update(volume: Path, source: Path) -> None:
    """Update ``volume`` from ``source`` the way the kubelet updates a Secret volume.

    The files are symlinks ``tls.crt -> ..data/tls.crt``; ``..data`` is a symlink to a
    timestamped directory, and an update swaps ``..data`` atomically (rename of a new link).
    """
    stamp = volume / f"..{datetime.now(UTC).strftime('%Y_%m_%d_%H_%M_%S.%f')}"
    shutil.copytree(source, stamp)
    old = os.readlink(volume / "..data") if (volume / "..data").is_symlink() else None
    os.symlink(stamp.name, volume / "..data_tmp")
    os.replace(volume / "..data_tmp", volume / "..data")
    for name in (CA_BUNDLE, TLS_CERT, TLS_KEY):
        if not (volume / name).is_symlink():
            os.symlink(f"..data/{name}", volume / name)
    if old is not None:
        shutil.rmtree(volume / old)


async def test_secret_volume_updates_under_load_with_zero_failures(tmp_path: Path) -> None:
    """The cluster procedure: rotate in a staging dir, inject, then update the Secret."""
    staging, volume = tmp_path / "staging", tmp_path / "volume"
    volume.mkdir()
    new_cert_dir(staging)
    _secret_volume_update(volume, staging)
    injected = tmp_path / "caBundle.pem"  # what the apiserver trusts (the injected caBundle)
    shutil.copy(staging / CA_BUNDLE, injected)
    tls = ReloadingTLS(volume / TLS_CERT, volume / TLS_KEY)
    served = [tls.loaded_fingerprint]
    async with serving(tls, injected) as load:
        for _ in range(3):
            result = rotate(staging, SERVICE, NAMESPACE)
            shutil.copy(staging / CA_BUNDLE, injected)  # `holdwarden certs inject`
            await load.progress()
            _secret_volume_update(volume, staging)  # kubectl apply of the Secret
            served.append(result.serving.fingerprint)
            await wait_until(lambda: tls.loaded_fingerprint == served[-1])
            await load.progress()
    assert load.failures == []
    assert load.seen == served
    assert tls.reloads == 3


async def test_half_written_and_mismatched_pairs_are_ignored_while_serving(
    tmp_path: Path,
) -> None:
    new_cert_dir(tmp_path)
    tls = ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)
    first = tls.loaded_fingerprint
    next_pair = generate_serving(
        load_cert_dir(tmp_path).ca, SERVICE, NAMESPACE, ip_addresses=["127.0.0.1"]
    )
    async with serving(tls, tmp_path / CA_BUNDLE) as load:
        # A certificate caught half-written (a non-atomic writer).
        (tmp_path / TLS_CERT).write_bytes(next_pair.cert_pem[: len(next_pair.cert_pem) // 2])
        await wait_until(lambda: tls.last_error is not None)
        assert "is not a PEM certificate" in (tls.last_error or "")
        await load.progress()
        # The whole certificate, but the key is still the old one.
        (tmp_path / TLS_CERT).write_bytes(next_pair.cert_pem)
        await wait_until(lambda: "not a usable pair" in (tls.last_error or ""))
        await load.progress()
        assert tls.loaded_fingerprint == first
        # Files gone (a Secret deleted): keep serving what is loaded.
        (tmp_path / TLS_KEY).unlink()
        await wait_until(lambda: "cannot stat" in (tls.last_error or ""))
        await load.progress()
        # The key lands: the pair is complete and is picked up.
        (tmp_path / TLS_KEY).write_bytes(next_pair.key_pem)
        await wait_until(lambda: tls.loaded_fingerprint == next_pair.fingerprint)
        assert tls.last_error is None
        await load.progress()
    assert load.failures == []
    assert load.seen == [first, next_pair.fingerprint]
    assert tls.reloads == 1


def test_unchanged_or_touched_files_do_not_reload(tmp_path: Path) -> None:
    new_cert_dir(tmp_path)
    tls = ReloadingTLS(str(tmp_path / TLS_CERT), str(tmp_path / TLS_KEY))
    assert tls.reload_if_changed() is False
    # Same contents, new inode and mtime (e.g. the same Secret re-applied).
    for name in (TLS_CERT, TLS_KEY):
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).unlink()
        (tmp_path / name).write_bytes(data)
    assert tls.reload_if_changed() is False
    assert tls.reloads == 0 and tls.last_error is None
    renewed = renew_serving(tmp_path, SERVICE, NAMESPACE)
    assert tls.reload_if_changed() is True
    assert tls.loaded_fingerprint == renewed.fingerprint
    assert tls.not_after == renewed.not_after
    assert tls.reload_if_changed() is False


def test_context_is_tls12_or_later_and_one_object(tmp_path: Path) -> None:
    new_cert_dir(tmp_path)
    tls = ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)
    context = tls.ssl_context
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    renew_serving(tmp_path, SERVICE, NAMESPACE)
    assert tls.reload_if_changed() is True
    assert tls.ssl_context is context


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: (d / TLS_KEY).unlink(), "cannot stat"),
        (lambda d: (d / TLS_CERT).write_text("not pem"), "is not a PEM certificate"),
        (
            lambda d: (d / TLS_KEY).write_bytes(generate_serving(generate_ca(), "x", "y").key_pem),
            "not a usable pair",
        ),
    ],
)
def test_initial_pair_must_be_servable(
    tmp_path: Path, setup: Callable[[Path], object], message: str
) -> None:
    new_cert_dir(tmp_path)
    setup(tmp_path)
    with pytest.raises(ReloadError, match=message):
        ReloadingTLS(tmp_path / TLS_CERT, tmp_path / TLS_KEY)


async def test_watch_survives_unexpected_errors(tmp_path: Path) -> None:
    new_cert_dir(tmp_path)

    class Flaky(ReloadingTLS):
        calls = 0

        def reload_if_changed(self) -> bool:
            self.calls += 1
            if self.calls <= 3:
                raise RuntimeError("boom")
            return super().reload_if_changed()

    tls = Flaky(tmp_path / TLS_CERT, tmp_path / TLS_KEY)
    watcher = asyncio.create_task(tls.watch(0.001))
    try:
        renewed = renew_serving(tmp_path, SERVICE, NAMESPACE)
        await wait_until(lambda: tls.loaded_fingerprint == renewed.fingerprint)
        assert tls.calls > 3
        assert not watcher.done()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert watcher.cancelled()
