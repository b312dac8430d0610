"""What a supervisor needs around the adapter's semantics (issue 11), against the REAL local
control plane: the instance bound end to end, errors it can act on, a client it does not
own, preflight that does not mask the call's own errors.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from adapter import Adapter, Ref, State
from adapter.errors import Invalid
from adapter.kube import Request
from holdwarden.localcluster import LocalCluster
from holdwarden.vocabulary import MAX_HOLD_INSTANCE
from tests.test_adapter_kube import Cluster, hold_annotations, make, meta
from tests.test_adapter_kube import A as KEYS

pytestmark = pytest.mark.controlplane


@pytest.fixture
def kc(namespace: str, admin_client: k8s.ApiClient, kueue_client: k8s.ApiClient) -> Cluster:
    return Cluster(namespace, admin_client, kueue_client)


# ==== the instance bound (item 4) =======================================================


@pytest.mark.parametrize("instance", [10**19, 2**63, 9_999_999_999_999_999_999])
def test_an_instance_above_int64_is_invalid_before_any_request(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, instance: int
) -> None:
    """Before the bound, Hold(10**19) wrote "10000000000000000000" and its Release was
    StaleHold; now both are Invalid and nothing is sent (not even the lazy preflight)."""
    seen: list[Request] = []
    adapter = make(cluster, supervisor_client, "kueue", before_request=seen.append)
    ref = Ref("anywhere", "job")
    with pytest.raises(Invalid, match=r"2\^63-1"):
        adapter.hold(ref, meta(instance), "r")
    with pytest.raises(Invalid, match=r"2\^63-1"):
        adapter.release(ref, meta(instance))
    assert seen == [] and adapter.request_count == 0


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_the_largest_instance_holds_and_releases_end_to_end(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, mode: str
) -> None:
    adapter = make(cluster, supervisor_client, mode)
    if mode == "kueue":
        ref, wl_name = kc.kueue_job("job")
        held: Any = lambda: kc.workload(wl_name)  # noqa: E731
    else:
        kc.create_trainjob("job")
        ref = Ref(kc.ns, "job")
        held = lambda: kc.trainjob("job")  # noqa: E731
    adapter.hold(ref, meta(MAX_HOLD_INSTANCE), "largest")
    assert hold_annotations(held())[KEYS.hold_instance] == str(MAX_HOLD_INSTANCE)
    observed = adapter.observe(ref)
    assert observed.state is State.HELD and observed.hold_instance == MAX_HOLD_INSTANCE
    adapter.hold(ref, meta(MAX_HOLD_INSTANCE), "largest")  # already in force: no write
    adapter.release(ref, meta(MAX_HOLD_INSTANCE))
    assert hold_annotations(held()) == {}
