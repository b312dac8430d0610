"""Plain mode on the real Trainer, JobSet and Job controller (no queue label, so Kueue
leaves the TrainJob alone), with the enforcer registered.

Hold suspends the TrainJob and the Job controller deletes its pods. Release while a pod of
the held execution remains (a finalizer keeps it) gives PodsRemain and writes nothing;
once the pod is gone Release runs the job again and A rises from 1 to 2.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, Ref
from holdwarden.adapter.errors import PodsRemain
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import Annotations
from rig.builders import trainjob_body
from rig.localcluster import SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.realstory import Objects, eventually, with_requests
from tests.real.enforcer import Enforcement, enforcement
from tests.real.story import assert_no_false_positives, live_pod_sets, meta
from tests.support.actors import Watcher

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

A = Annotations()


@pytest.fixture(scope="module")
def enforced(
    real_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Enforcement]:
    with enforcement(real_cluster, tmp_path_factory.mktemp("enforcer-plain")) as running:
        yield running


def test_plain_mode_hold_and_release_on_the_real_controllers(
    real_cluster: LocalCluster, real_admin: k8s.ApiClient, enforced: Enforcement
) -> None:
    namespace = real_cluster.create_namespace(
        f"plain-{enforced.token[:6]}-{int(time.time()) % 100000}", labels=enforced.labels()
    )
    objects = Objects(real_admin, namespace)
    watcher = Watcher(real_admin, namespace)
    watcher.start()
    supervisor = real_cluster.api_client(SUPERVISOR_IDENTITY)
    adapter = Adapter(Config(mode="plain"), supervisor)
    try:
        body = with_requests(trainjob_body("job", suspend=True))
        body["metadata"]["namespace"] = namespace
        ref = adapter.start(body, meta())
        assert ref == Ref(namespace, "job")
        adapter.open(ref, meta())
        first = eventually(objects.pod_uids, "Trainer, JobSet and the Job controller make pods")
        assert objects.attempt() == "1"
        kept = objects.keep(objects.pods()[0])

        adapter.hold(ref, meta(1), "node lost")
        assert objects.suspended()
        eventually(lambda: len(objects.pods()) == 1, "the Job controller deletes the pods")
        observed = adapter.observe(ref)
        assert observed.state is State.HELD, observed
        assert kept in observed.leftover_pods

        with pytest.raises(PodsRemain):
            adapter.release(ref, meta(1))
        # Not a resourceVersion comparison: real Trainer updates the TrainJob's status at
        # moments of its own after the suspend. What Release must not have written:
        after = objects.trainjob()
        assert after["spec"]["suspend"] is True, "released while pods remain"
        assert after["metadata"]["annotations"].get(A.hold_instance) == "1"
        assert objects.attempt() == "1"

        objects.let_go(kept)
        eventually(lambda: not objects.pods(), "the held execution's last pod goes")
        adapter.release(ref, meta(1))
        assert not objects.suspended()
        assert objects.attempt() == "2"
        second = eventually(lambda: objects.pod_uids() - first, "the second execution's pods")
    finally:
        watcher.stop()
        supervisor.close()  # type: ignore[no-untyped-call]

    for live in live_pod_sets(watcher.events()):
        assert not (live & first and live & second), "pods of two executions at once"
    assert_no_false_positives(real_cluster, enforced)
