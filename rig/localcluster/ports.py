"""Free TCP ports for the local control plane, its controllers and the test servers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default, used when /proc cannot be read.
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 10000
_TRIES = 200
# Ports this process has handed out: two calls in a row never give the same port, though
# neither is bound until later.
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (inclusive)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing is bound to now, below the ephemeral range.

    The port is checked here and bound later by another process (etcd, kube-apiserver, a
    controller, an enforcer). A port from ``bind(port=0)`` is an ephemeral one, so in
    between any outgoing connection on the machine may take it as its local port, and the
    server then fails with "address already in use" (seen once, on kube-apiserver). Only a
    deliberate bind can take a port below that range, and every other test server binds
    port 0. So the port is drawn at random from [10000, start of the range).
    """
    low, _ = ephemeral_range()
    if low - _LOWEST < 1000:  # an unusual range: fall back to the kernel's choice
        return _kernel_port(host)
    for _ in range(_TRIES):
        port = random.randrange(_LOWEST, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    return _kernel_port(host)


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
