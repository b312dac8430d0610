"""The rig's node lifecycle keeps tainting after the controller's full-disruption mode.

When one pass of the real node-lifecycle controller finds every node of a zone not Ready
(at start-up before the kubelets report, or with every kwok lagging on a starved machine)
it stops all evictions, and resumes them when a node is Ready again. The lost-node story
depends on the resumption: a lost node must still get its ``unreachable:NoExecute``
taint. This pins the rig's ``--node-eviction-rate`` (rig/localcluster/controllers.py) to a
value at which kube-controller-manager v1.36.3 does resume: at exactly 1 it never does.
"""

from __future__ import annotations

import pytest

from rig.localcluster import LocalCluster
from rig.localcluster.nodes import ready_status, unreachable_taint
from rig.localcluster.realstory import NotWithin, eventually

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]


def test_a_lost_node_is_tainted_after_every_node_was_down() -> None:
    with LocalCluster(controllers=("kube-controller-manager",), nodes=3) as cluster:
        assert cluster.nodes is not None
        nodes = cluster.nodes
        log = cluster.workdir / "kube-controller-manager.log"

        def said(text: str) -> bool:
            return text in log.read_text(errors="replace")

        for name in nodes.names:
            nodes.lose(name)
        eventually(lambda: said("Entering master disruption mode"), "full disruption", 120)
        for name in nodes.names:
            nodes.restore(name)
        eventually(lambda: said("Exiting master disruption mode"), "its end", 120)
        eventually(
            lambda: all(ready_status(nodes.get(n)) == "True" for n in nodes.names),
            "every node Ready again",
            120,
        )

        lost = nodes.names[0]
        nodes.lose(lost)
        eventually(lambda: ready_status(nodes.get(lost)) == "Unknown", "NotReady", 120)
        try:
            eventually(lambda: unreachable_taint(nodes.get(lost), "NoExecute"), "taint", 60)
        except NotWithin as exc:
            pytest.fail(f"{exc}\n{nodes.lifecycle_evidence(lost)}")
