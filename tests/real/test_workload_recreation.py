"""Can a hold be lost by making Kueue recreate the held Workload?

Kueue deletes and recreates a suspended job's Workload when the job no longer matches it
(its pod sets changed). A held Workload carries the hold; a recreated one would not. So
change a held TrainJob's pod sets (as a user with edit rights) and see what the real Kueue
does: the hold must survive it, whether the write is refused or the Workload kept.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import TRAINJOB, Annotations
from rig.builders import trainjob_body
from rig.localcluster import EDITOR_USER, SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    Objects,
    eventually,
    make_queues,
    with_requests,
)
from tests.real.enforcer import Enforcement
from tests.real.story import meta
from tests.real.test_kueue_mode import enforced  # noqa: F401  (module fixture)

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

A = Annotations()
# Pod-set changes a user with edit rights may try on a suspended TrainJob: spec.trainer is
# immutable (the CRD's CEL rule), spec.runtimePatches is not.
CHANGES = (
    {"spec": {"trainer": {"resourcesPerNode": {"requests": {"cpu": "200m"}}}}},
    {
        "spec": {
            "runtimePatches": [
                {
                    "manager": "example.com/alice",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "spec": {"nodeSelector": {"pool": "other"}}
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ]
        }
    },
)


def test_a_pod_set_change_of_a_held_trainjob_does_not_lose_the_hold(
    real_cluster: LocalCluster,
    real_admin: k8s.ApiClient,
    enforced: Enforcement,  # noqa: F811
) -> None:
    namespace = real_cluster.create_namespace(
        f"recreate-{enforced.token[:6]}-{int(time.time()) % 100000}", labels=enforced.labels()
    )
    make_queues(real_admin, namespace, admission_checks=[enforced.check_name])
    objects = Objects(real_admin, namespace)
    with real_cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        adapter = Adapter(Config(mode="kueue"), supervisor)
        body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
        body["metadata"]["namespace"] = namespace
        ref = adapter.start(body, meta())
        adapter.open(ref, meta())
        eventually(objects.pod_uids, "Kueue admits and pods exist")
        adapter.hold(ref, meta(1), "node lost")
        eventually(objects.suspended, "Kueue suspends the TrainJob")
        eventually(lambda: not objects.pods(), "the pods go")
        held = objects.workload()
        assert held is not None

        outcomes = []
        with real_cluster.api_client(EDITOR_USER) as alice:
            for change in CHANGES:
                try:
                    k8s.CustomObjectsApi(alice).patch_namespaced_custom_object(
                        TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, "job",
                        change,
                    )  # fmt: skip
                    outcomes.append("accepted")
                except k8s.ApiException as exc:
                    outcomes.append(f"refused {exc.status}: {(exc.body or '')[:300]}")
        time.sleep(20)  # time for Kueue to notice a mismatch and act on it
        workloads = objects.workloads()
        observed = adapter.observe(ref)
    print(f"edits: {outcomes}")
    print(f"workloads now: {[(w['metadata']['uid'], w['spec'].get('active')) for w in workloads]}")
    print(f"observe: {observed}")
    assert not objects.pods(), "the held job ran again"
    assert objects.suspended(), "the held job was unsuspended"
    assert observed.state is State.HELD, observed
    assert [w["metadata"]["uid"] for w in workloads] == [held["metadata"]["uid"]]
