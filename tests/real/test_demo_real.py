"""``holdwarden demo`` on its default, the real Kueue, Trainer, JobSet and
kube-controller-manager: every step turns out as narrated.

The demo starts its own control plane and controllers (the story is the README's, not a
fixture's), so this checks what a person running ``make demo`` sees.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]


def _observations(out: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.split("observe: ", 1)[1])
        for line in out.splitlines()
        if line.lstrip().startswith("observe: ")
    ]


def test_demo_on_the_real_controllers_tells_the_whole_story() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "!!" not in out, out  # a step that did not turn out as the story says
    assert "with the real kueue, trainer, jobset, kube-controller-manager" in out
    # Kueue mode: the real Kueue evicts for the deactivation; the gate keeps the job
    # waiting while the held execution's pod remains, and re-admits once it is gone.
    assert re.search(r"Kueue's eviction: \{.*\"reason\": \"Deactivated\"", out), out
    assert "[held-workload-inactive]" in out and "StaleHold (rejected)" in out
    assert "the readmission gate keeps the job waiting" in out
    assert "attempt (A) is 2" in out
    # Plain mode: Release while the pod remains is PodsRemain; afterwards A rises.
    assert "PodsRemain (pods-remain)" in out
    assert re.search(r"\d+ pods of execution 2", out), out
    assert "the enforcer refused none of the real controllers' writes" in out

    kueue = [o for o in _observations(out) if o["ref"] == "team-a/llm-pretrain"]
    waiting = [o for o in kueue if o["state"] == "waiting-for-admission"]
    assert waiting and waiting[0]["leftoverPods"], kueue
    assert waiting[0]["admissionChecks"] == {"holdwarden-readmission": "Pending"}
    assert kueue[-1]["state"] == "running" and kueue[-1]["attempt"] == 2
    assert not kueue[-1]["ungatedAdmission"]
    plain = [o for o in _observations(out) if o["ref"] == "team-a/eval-sweep"]
    assert [o["state"] for o in plain][-1] == "running" and plain[-1]["attempt"] == 2
    assert "nothing left running" in out


def test_demo_lost_node_story_on_nodes_tells_it_as_it_happens() -> None:
    """``holdwarden demo --story lost-node``: kwok nodes, the real scheduler and node
    lifecycle; every step it narrates turns out so."""
    result = subprocess.run(
        [sys.executable, "-m", "holdwarden.cli", "demo", "--story", "lost-node"],
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "!!" not in out, out
    assert "kube-scheduler and 3 kwok nodes" in out
    assert re.search(r"pod \S+ Running on kwok-\d", out), out
    assert "Ready=Unknown (NotReady)" in out
    assert "taint node.kubernetes.io/unreachable:NoExecute" in out
    assert "the readmission gate keeps the job waiting" in out
    assert "1 pod(s) of the previous execution remain" in out or re.search(
        r"\d+ pod\(s\) of the previous execution remain", out
    )
    assert "attempt (A) is 2" in out
    assert re.search(r"\d+ pods of execution 2 run on kwok-", out), out
    held, running = _observations(out)
    assert held["state"] == "held" and held["leftoverPods"], held
    assert running["state"] == "running" and running["attempt"] == 2
    assert "the enforcer refused none of the real controllers' writes" in out
