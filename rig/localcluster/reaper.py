"""A watchdog that ends a local control plane whose owner died, and removes its files.

Why a separate process: ``PR_SET_PDEATHSIG`` alone does not make a killed run leave nothing
behind. Its signal reaches etcd and kube-apiserver at the same moment, the apiserver's
graceful shutdown then waits on an etcd that is gone, and nobody removes the working
directory in ``/dev/shm``. The reaper outlives its owner (its own session, deaf to the
terminal's signals), notices the owner's death as end-of-file on a pipe only the owner
holds open, then SIGKILLs every process group it was told about and deletes the directory.

Protocol on the reaper's standard input, one line each:
- ``pid N``: a child the owner started, leader of its own process group;
- ``node NETNS HOST_IF ROOT``: a real node (realnode.py) whose containers, mounts,
  network namespaces and link are to be removed (``realnode.reap_node``) after the kill;
- ``done``: the owner stopped everything itself; exit without touching anything.
End-of-file without ``done`` means the owner is gone: reap.

Invariant: after the owner dies, by any signal, every announced process group is sent
SIGKILL and the working directory is removed, within about a second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

_GONE_WAIT_S = 5.0
STALE_PREFIX = "holdwarden-cp-"
OWNER_FILE = "owner.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_groups(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _GONE_WAIT_S
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def run(workdir: Path, commands: IO[str], remove_dir: bool = True) -> None:
    """Read the protocol from ``commands`` until ``done`` or end-of-file (then reap)."""
    pids: list[int] = []
    nodes: list[list[str]] = []
    for line in commands:
        word, _, arg = line.strip().partition(" ")
        if word == "done":
            return
        if word == "pid" and arg.isdigit():
            pids.append(int(arg))
        if word == "node" and len(arg.split(" ", 2)) == 3:
            nodes.append(arg.split(" ", 2))
    _kill_groups(pids)
    if nodes:
        # Only now: importing the node's module costs a second the common case need not pay.
        from rig.localcluster.realnode import reap_node

        for netns, host_if, root in nodes:
            with contextlib.suppress(Exception):
                reap_node(Path(root), netns, host_if)
    if remove_dir:
        shutil.rmtree(workdir, ignore_errors=True)


def sweep_stale(parent: Path) -> list[Path]:
    """Remove working directories under ``parent`` whose owner process no longer exists.

    A run killed before its reaper could act (the reaper itself killed, say) still leaves
    nothing behind for long: the next control plane removes it. Only directories with our
    prefix and an owner file naming a dead pid are touched.
    """
    removed: list[Path] = []
    for candidate in parent.glob(f"{STALE_PREFIX}*"):
        owner = candidate / OWNER_FILE
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


class Reaper:
    """The owner's handle on a reaper process for ``workdir``."""

    def __init__(self, workdir: Path, remove_dir: bool = True) -> None:
        command = [sys.executable, "-m", "rig.localcluster.reaper", str(workdir)]
        if not remove_dir:
            command.append("--keep-dir")  # a directory the caller chose is the caller's
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            # Its own session: a Ctrl-C or a kill of the test's process group must not
            # take the reaper down with the processes it is there to clean up after.
            start_new_session=True,
            close_fds=True,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    def announce(self, pid: int) -> None:
        """Tell the reaper about a child (leader of its own process group)."""
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self._process.stdin.write(f"pid {pid}\n")
            self._process.stdin.flush()

    def announce_node(self, netns: str, host_if: str, root: Path) -> None:
        """Tell the reaper about a real node to reap after the kill."""
        assert self._process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self._process.stdin.write(f"node {netns} {host_if} {root}\n")
            self._process.stdin.flush()

    def dismiss(self) -> None:
        """The owner cleaned up itself: let the reaper exit without acting."""
        stdin = self._process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError, ValueError):
                stdin.write("done\n")
                stdin.flush()
                stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _main() -> None:
    # Deaf to the terminal and to the polite signals a dying test run spreads around.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    run(Path(sys.argv[1]), sys.stdin, remove_dir="--keep-dir" not in sys.argv[2:])


if __name__ == "__main__":
    _main()
