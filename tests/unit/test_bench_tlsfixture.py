"""bench/tlsfixture.py's ``write_serving_tls`` does what the bench scripts rely on."""

from __future__ import annotations

import asyncio
import ssl
import stat
from pathlib import Path

import pytest

from bench.tlsfixture import write_serving_tls


def test_writes_the_three_files_and_the_key_is_private(tmp_path: Path) -> None:
    directory = tmp_path / "certs"  # created when missing
    write_serving_tls(directory)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    assert modes == {"ca.crt": 0o644, "tls.crt": 0o644, "tls.key": 0o600}


def test_the_context_trusts_the_server_on_127_0_0_1_and_nothing_else(tmp_path: Path) -> None:
    context = write_serving_tls(tmp_path, namespace="probe")
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def handshake(client: ssl.SSLContext) -> None:
        async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        try:
            async with asyncio.timeout(10):
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
                )
            writer.close()
        finally:
            server.close()

    asyncio.run(handshake(context))
    stranger = write_serving_tls(tmp_path / "other")  # a new CA: does not trust the first
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(handshake(stranger))
