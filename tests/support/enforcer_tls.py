"""The real enforcer over TLS for tests: in this event loop, or as ``holdwarden serve``.

``serving(...)`` runs ``EnforcerServer`` (TLS, guard, audit log) in the test's own event
loop. ``ServeProcess`` runs the real command line in a child process, for what needs a
real signal (SIGTERM) or the process's own memory. ``raw_request`` / ``read_response``
speak HTTP/1.1 on a raw TLS stream, so a test can stop half-way through a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.webhook_bench import image_malloc_env
from holdwarden.certs.generate import KeyPair, generate_ca, generate_serving
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.cli.enforcer import EnforcerServer
from holdwarden.config import Config, WebhookConfig
from rig.localcluster.ports import free_port
from tests.support.review_samples import review, trainjob

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Pki:
    """A CA and a serving pair for 127.0.0.1, written to ``directory``."""

    directory: Path
    ca: KeyPair

    @classmethod
    def create(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = generate_ca()
        leaf = generate_serving(ca, "holdwarden", "ns", ip_addresses=["127.0.0.1"])
        (directory / "tls.crt").write_bytes(leaf.cert_pem)
        (directory / "tls.key").write_bytes(leaf.key_pem)
        (directory / "ca.crt").write_bytes(ca.cert_pem)
        return cls(directory, ca)

    def client_context(self, cert: KeyPair | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.directory / "ca.crt"))
        if cert is not None:
            cert_file = self.directory / f"client-{id(cert)}.crt"
            key_file = self.directory / f"client-{id(cert)}.key"
            cert_file.write_bytes(cert.cert_pem)
            key_file.write_bytes(cert.key_pem)
            context.load_cert_chain(cert_file, key_file)
        return context


def review_body(refuse: bool = False, name: str = "job") -> bytes:
    """An UPDATE review of a held TrainJob: allowed, or (``refuse``) unsuspending it."""
    doc = review(
        old=trainjob(suspend=True, instance="3", name=name),
        new=trainjob(suspend=not refuse, instance="3", name=name),
        name=name,
    )
    return json.dumps(doc).encode()


def request_bytes(body: bytes, *, extra_headers: str = "") -> bytes:
    head = (
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra_headers}\r\n"
    )
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status, headers, body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def open_tls(
    port: int, context: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Read until the peer closes (True) or sends something (False)."""
    try:
        return await reader.read(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


def close_quietly(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


@dataclass
class Served:
    server: EnforcerServer
    pki: Pki

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def context(self) -> ssl.SSLContext:
        return self.pki.client_context()


@contextlib.asynccontextmanager
async def serving(directory: Path, **webhook: Any) -> AsyncIterator[Served]:
    """``EnforcerServer`` on free loopback ports with ``webhook`` overrides."""
    pki = Pki.create(directory)
    config = Config(
        webhook=WebhookConfig(
            listen_address="127.0.0.1:0",
            metrics_address="127.0.0.1:0",
            cert_dir=directory,
            audit_log=directory / "audit.jsonl",
            **webhook,
        )
    )
    server = EnforcerServer(config, tls=ReloadingTLS(directory / "tls.crt", directory / "tls.key"))
    await server.start()
    try:
        yield Served(server, pki)
    finally:
        await server.stop()


# --- holdwarden serve in a child process ---------------------------------------------------


class ServeProcess:
    """``holdwarden serve --config FILE`` on free ports; ``webhook`` keys as in the YAML."""

    def __init__(self, directory: Path, pki: Pki, webhook: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.pki = pki
        self.port = free_port()
        self.metrics_port = free_port()
        config = {
            "webhook": {
                "listenAddress": f"127.0.0.1:{self.port}",
                "metricsAddress": f"127.0.0.1:{self.metrics_port}",
                "certDir": str(pki.directory),
                "auditLog": str(directory / "audit.jsonl"),
                **webhook,
            }
        }
        (directory / "config.yaml").write_text(yaml.safe_dump(config))
        self.log_path = directory / "serve.log"
        self._log = self.log_path.open("wb")
        # The image's malloc settings (Dockerfile ENV), so a memory bound measured here is
        # the shipped server's.
        env = {**os.environ, **image_malloc_env(), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "holdwarden.cli",
                "serve",
                "--config",
                str(directory / "config.yaml"),
            ],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.terminated_at: float | None = None

    async def ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.log()}")
            if await self.readyz() == 200:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"serve not ready within {timeout}s: {self.log()}")

    async def readyz(self) -> int | None:
        try:
            async with asyncio.timeout(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.metrics_port)
                try:
                    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    status, _, _ = await read_response(reader)
                    return status
                finally:
                    close_quietly(writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            return None

    def terminate(self) -> None:
        self.terminated_at = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)

    async def exited(self, timeout: float) -> float:
        """Wait for the process to end; seconds since ``terminate``."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"serve still running {timeout}s after SIGTERM: {self.log()}")
            await asyncio.sleep(0.02)
        assert self.terminated_at is not None
        return time.monotonic() - self.terminated_at

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()


def rss_kib(pid: int, field: str = "VmRSS:") -> int:
    """The process's resident memory now (VmRSS), or at its peak (``VmHWM:``), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def run_in_thread(server: EnforcerServer, name: str = "enforcer") -> Callable[[], None]:
    """Start ``server`` on an event loop in a thread of its own (a failed start is raised
    here, at most 30 s later); returns how to stop it (drain, then end the loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        raise

    def stop() -> None:
        stopping = asyncio.run_coroutine_threadsafe(server.stop(), loop)
        try:
            stopping.result(30)
        except TimeoutError:
            # Say where it hangs, and do not leave the loop (and its threads) running
            # into the next test.
            stacks = "\n".join(_task_stacks(loop))
            raise AssertionError(f"EnforcerServer.stop() did not end in 30 s:\n{stacks}") from None
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            if not thread.is_alive():
                loop.close()

    return stop


def _task_stacks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Each unfinished task of ``loop`` with the line it waits on (read from another thread:
    a snapshot, good enough to say where a stop hangs)."""
    lines = []
    for task in list(asyncio.all_tasks(loop)):
        frames = task.get_stack(limit=8)
        where = " <- ".join(
            f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}" for f in frames
        )
        lines.append(f"{task.get_name()}: {where}")
    return lines
