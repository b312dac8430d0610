"""The test harness itself: asyncio tests are bounded, and a killed run leaves nothing behind."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rig.localcluster import reaper
from tests.conftest import bounded_coroutine

# -- asyncio budgets -------------------------------------------------------------------


def test_a_stuck_asyncio_test_fails_at_its_budget_instead_of_hanging() -> None:
    async def stuck() -> None:
        await asyncio.sleep(3600)

    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish within its asyncio budget"):
        asyncio.run(bounded_coroutine(stuck, 0.2, "stuck")())  # type: ignore[arg-type]
    assert time.monotonic() - began < 5


def test_a_bounded_test_keeps_its_result_and_its_own_timeout_errors() -> None:
    async def answer(value: int) -> int:
        await asyncio.sleep(0)
        return value

    async def own_timeout() -> None:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)

    assert asyncio.run(bounded_coroutine(answer, 5, "answer")(7)) == 7  # type: ignore[arg-type]
    # A TimeoutError the test raises itself is the test's, not the budget's.
    with pytest.raises(TimeoutError):
        asyncio.run(bounded_coroutine(own_timeout, 5, "own")())  # type: ignore[arg-type]


def test_every_asyncio_test_is_wrapped(request: pytest.FixtureRequest) -> None:
    wrapped = [
        item.nodeid
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and asyncio.iscoroutinefunction(item.obj)
        and not hasattr(item.obj, "__wrapped__")
    ]
    assert wrapped == []


# -- the reaper ------------------------------------------------------------------------


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def test_reaper_kills_announced_groups_and_removes_the_dir_when_the_owner_goes(
    tmp_path: Path,
) -> None:
    work = tmp_path / "cp"
    work.mkdir()
    (work / "etcd-data").write_text("x")
    child = _sleeper()
    reaper.run(work, io.StringIO(f"pid {child.pid}\n"))  # end-of-file: the owner is gone
    assert child.wait(timeout=5) == -signal.SIGKILL
    assert not work.exists()


def test_reaper_does_nothing_once_dismissed(tmp_path: Path) -> None:
    child = _sleeper()
    try:
        reaper.run(tmp_path, io.StringIO(f"pid {child.pid}\ndone\n"))
        assert child.poll() is None
        assert tmp_path.exists()
    finally:
        child.kill()
        child.wait()


def test_sweep_removes_only_dirs_of_dead_owners(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live, foreign = (tmp_path / f"{reaper.STALE_PREFIX}{n}" for n in ("a", "b", "c"))
    for folder in (stale, live, foreign):
        folder.mkdir()
    (stale / reaper.OWNER_FILE).write_text(f"{dead.pid}\n")
    (live / reaper.OWNER_FILE).write_text(f"{os.getpid()}\n")
    assert reaper.sweep_stale(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and foreign.exists()


_OWNER = textwrap.dedent(
    """
    import json, sys, time
    from rig.localcluster import LocalCluster
    cluster = LocalCluster()
    cluster.start()
    print(json.dumps({"workdir": str(cluster.workdir),
                      "pids": [p.pid for _, p in cluster._processes]}), flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it holds no memory or ports and is not "behind".
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.controlplane
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "term"])
def test_a_killed_run_leaves_no_process_and_no_files(sig: signal.Signals) -> None:
    """Kill the whole process group of a run, as a CI time limit or Ctrl-C does."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()  # bounded by the control plane's own start timeout
        assert line, owner.stderr.read().decode() if owner.stderr else "no output"
        started = json.loads(line)
        workdir, pids = Path(started["workdir"]), started["pids"]
        assert workdir.is_dir() and len(pids) == 2 and all(_alive(p) for p in pids)
        os.killpg(owner.pid, sig)
        owner.wait(timeout=30)
        deadline = time.monotonic() + 20
        while (workdir.exists() or any(_alive(p) for p in pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if _alive(p)] == []
        assert not workdir.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
