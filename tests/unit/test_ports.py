"""free_port: the ports the local control plane and the test servers bind later."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rig.localcluster import ports
from rig.localcluster.ports import ephemeral_range, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    """A port an outgoing connection can take (the ephemeral range) is never handed out:
    kube-apiserver once failed to start with "address already in use" on such a port."""
    low, high = ephemeral_range()
    assert 1024 < low <= high
    ports = [free_port() for _ in range(50)]
    assert all(10000 <= port < low for port in ports), ports
    assert len(set(ports)) == len(ports)  # none handed out twice, though none is bound yet
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as spare_sock:
            spare_sock.bind(("127.0.0.1", 0))
            spare = spare_sock.getsockname()[1]
        draws = iter([taken, spare])
        monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (65000, 65535))
        assert ports.free_port() == spare


def test_a_port_handed_out_here_is_not_handed_out_to_another_run() -> None:
    # Two suites on one machine: between this process's check and its server's bind, the
    # other must not hand out the same port. It is reserved while this process lives.
    port = free_port()
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from rig.localcluster import ports; print(ports._reserve({port}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert other.stdout.strip() == "False"
    # When a run ends, however it ends, its reservations go with it.
    gone = subprocess.run(
        [sys.executable, "-c", "from rig.localcluster import ports; print(ports.free_port())"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert ports._reserve(int(gone.stdout.strip()))
