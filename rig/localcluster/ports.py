"""Free TCP ports for the local control plane, its controllers and the test servers."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

# Linux's default, used when /proc cannot be read.
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 10000
_TRIES = 200
# Ports this process has handed out: two calls in a row never give the same port, though
# neither is bound until later.
_handed_out: set[int] = set()
# Another test run on the same machine checks its ports the same way, so between this
# process's check and its server's bind the other run could hand out the same port (seen:
# two suites at once, a JobSet controller "bind: address already in use"). Each port handed
# out is therefore also reserved for as long as this process lives: an flock on a file
# named after it, in one directory every run shares. The kernel drops the lock when the
# process ends, however it ends, so nothing is left to clean up.
_RESERVATIONS = Path(tempfile.gettempdir()) / "holdwarden-ports"
_reserved: dict[int, int] = {}  # port -> the open file descriptor holding its lock


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
        if not _reserve(port):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    return _kernel_port(host)


def _reserve(port: int) -> bool:
    """Take ``port``'s machine-wide reservation for this process (False: another live
    process holds it, or it cannot be taken here)."""
    if port in _reserved:
        return True
    try:
        _RESERVATIONS.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(_RESERVATIONS / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _reserved[port] = fd
    return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
