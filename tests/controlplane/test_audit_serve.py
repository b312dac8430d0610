"""A real ``holdwarden serve``: SIGHUP reopens the audit log (and does not kill), a renamed
or deleted log is followed, and a full disk makes /readyz fail while refusals still refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from holdwarden.webhook.audit import read_audit, rotated_path
from tests.controlplane.test_audit_durability import start_serve
from tests.support.audit_helpers import (
    assert_whole_lines,
    eventually,
    eventually_async,
    fill,
    small_tmpfs,
)
from tests.support.review_samples import review, trainjob

BUDGET = 90.0


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    session: aiohttp.ClientSession
    port: int
    metrics_port: int
    audit_log: Path
    ca: Path

    async def refuse(self, uid: str) -> dict[str, Any]:
        req = review(old=trainjob(suspend=True, instance="4"), new=trainjob(instance="4"), uid=uid)
        async with self.session.post(
            f"https://127.0.0.1:{self.port}/validate", json=req, ssl=self._ssl()
        ) as response:
            assert response.status == 200
            answer: dict[str, Any] = (await response.json())["response"]
            return answer

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    async def ready(self) -> int:
        async with self.session.get(f"http://127.0.0.1:{self.metrics_port}/readyz") as response:
            return response.status

    async def metric(self, name: str) -> float:
        async with self.session.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as response:
            text = await response.text()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rpartition(" ")[2])
        raise AssertionError(f"{name} not exported")


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[Serve]:
    proc, port, metrics_port, audit_log, ca = await asyncio.to_thread(start_serve, tmp_path)
    try:
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            yield Serve(proc, session, port, metrics_port, audit_log, ca)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 10)


async def test_sighup_reopens_after_mv_and_does_not_kill(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET), serving(tmp_path) as serve:
        assert (await serve.refuse("one"))["allowed"] is False
        rotated = rotated_path(serve.audit_log, 1)
        os.rename(serve.audit_log, rotated)  # logrotate: mv, then postrotate: kill -HUP
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(serve.audit_log.exists, 10, lambda: "the log was not reopened")
        assert serve.proc.poll() is None, "SIGHUP ended the process"
        # The new file exists before the reopen is counted (fsync of the folder, the torn
        # tail check): poll the counter, bounded, absent counting as not yet.
        reopens = 'holdwarden_webhook_audit_reopens_total{reason="signal"}'

        async def counted() -> bool:
            try:
                return await serve.metric(reopens) >= 1
            except AssertionError:
                return False

        await eventually_async(counted, 10, lambda: "the reopen was not counted")
        assert await serve.metric(reopens) == 1
        assert (await serve.refuse("two"))["allowed"] is False
        assert [r["uid"] for r in read_audit(rotated).records] == ["one"]
        assert [r["uid"] for r in read_audit(serve.audit_log).records] == ["one", "two"]
        serve.proc.send_signal(signal.SIGHUP)  # again, nothing moved: still alive, still writing
        assert (await serve.refuse("three"))["allowed"] is False
        assert serve.proc.poll() is None
    assert serve.proc.returncode == 0  # it still stops cleanly on SIGTERM


async def test_mv_or_delete_without_a_signal_is_followed(tmp_path: Path) -> None:
    async with asyncio.timeout(BUDGET), serving(tmp_path) as serve:
        await serve.refuse("one")
        os.rename(serve.audit_log, rotated_path(serve.audit_log, 1))
        await serve.refuse("two")
        serve.audit_log.unlink()
        await serve.refuse("three")
        # The configured path shows what was written after the delete; with the rotated
        # copy, holdwarden audit shows everything that still exists.
        assert [r["uid"] for r in read_audit(serve.audit_log).records] == ["one", "three"]
        assert await serve.metric('holdwarden_webhook_audit_reopens_total{reason="deleted"}') == 1
        assert await serve.metric('holdwarden_webhook_audit_reopens_total{reason="renamed"}') == 1


async def test_disk_full_refuses_counts_and_fails_readyz_until_space_returns(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "audit") as small:
        async with asyncio.timeout(BUDGET), serving(tmp_path) as serve:
            assert (await serve.refuse("fits"))["allowed"] is False
            assert await serve.ready() == 200
            filler = fill(small, leave=0)
            refused = 0
            for i in range(200):  # the page in use fills after a few lines
                answer = await serve.refuse(f"full-{i}")
                assert answer["allowed"] is False  # the refusal stays a refusal
                assert answer["status"]["code"] == 403
                if await serve.metric("holdwarden_webhook_audit_write_errors_total") > 0:
                    refused = i + 1
                    break
            assert refused, "the full disk never failed a write"
            assert await serve.ready() == 503
            assert await serve.metric("holdwarden_webhook_audit_writable") == 0
            assert await serve.metric("holdwarden_webhook_audit_failed_writes_total") >= 1
            assert_whole_lines(serve.audit_log)  # nothing torn, nothing to glue onto
            filler.unlink()

            async def recovered() -> bool:
                return await serve.ready() == 200

            await eventually_async(
                recovered, 15, lambda: "/readyz did not recover after space came back", 0.1
            )
            assert (await serve.refuse("after"))["allowed"] is False
            lines = assert_whole_lines(serve.audit_log)
            uids = [r["uid"] for r in read_audit(serve.audit_log).records]
            assert uids[0] == "fits" and uids[-1] == "after"
            assert f"full-{refused - 1}" not in uids  # the failed line is absent, not torn
            assert read_audit(serve.audit_log).skipped == 0 and lines
