"""The traps' pure decisions (adapter/traps.py): table tests and properties.

The conditions in the tables are the ones Kueue v0.19.2 writes (read from its workload
controller and jobframework reconciler; the real-controller story is
tests/real/test_kueue_traps.py). The Trainer CRDs are the real ones: v2.3.0's from
../shared/crds (what the rig installs), v2.2.1's vendored in tests/support/crds/trainer-v2.2.1.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from holdwarden.adapter import traps
from holdwarden.adapter.traps import KueueSettings, RuntimeName
from holdwarden.adapter.types import Observation, Ref, ReleaseResult, State
from rig.localcluster.cluster import find_crd_dir

CRDS = Path(__file__).resolve().parents[1] / "support" / "crds"


def cond(type_: str, status: str, reason: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": ""}


def workload(*conditions: dict[str, str], active: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": "trainjob-job-1a2b3", "namespace": "team-a"},
        "spec": {"active": active},
        "status": {"conditions": list(conditions)},
    }


MET = "DeactivatedDueToMaximumExecutionTimeExceeded"
RLE = "DeactivatedDueToRequeuingLimitExceeded"
RESERVED = cond("QuotaReserved", "True", "QuotaReserved")
UNRESERVED = cond("QuotaReserved", "False", "Pending")


@pytest.mark.parametrize(
    ("conditions", "blocked", "why"),
    [
        ((), None, "a fresh Workload"),
        (
            (cond("Evicted", "True", MET), UNRESERVED, cond("Requeued", "False", MET)),
            MET,
            "Kueue's time limit, the job stopped: what v0.19.2 leaves, and keeps after a release",
        ),
        (
            (cond("Evicted", "True", RLE), UNRESERVED, cond("Requeued", "False", RLE)),
            RLE,
            "the requeuing limit",
        ),
        (
            (cond("Evicted", "True", MET), RESERVED),
            MET,
            "evicted, quota still reserved: Requeued=False follows when the job stops",
        ),
        (
            (cond("DeactivationTarget", "True", "MaximumExecutionTimeExceeded"), RESERVED),
            MET,
            "being deactivated while admitted",
        ),
        (
            (
                cond("Evicted", "True", "Deactivated"),
                UNRESERVED,
                cond("Requeued", "False", "Deactivated"),
            ),
            None,
            "someone else's deactivation (a hold): v0.19 requeues it on reactivation",
        ),
        (
            (cond("Evicted", "True", MET), UNRESERVED, cond("Requeued", "True", "Reactivated")),
            None,
            "Kueue v0.20 after reactivation: Requeued is True again",
        ),
        (
            (cond("Evicted", "True", MET), UNRESERVED),
            None,
            "deactivated while not admitted: Kueue never wrote Requeued",
        ),
        (
            (cond("Evicted", "False", "QuotaReserved"), RESERVED, cond("Requeued", "True", "x")),
            None,
            "admitted again after the eviction",
        ),
        (
            (cond("Requeued", "False", "DeactivatedDueTo"),),
            None,
            "a reason with no cause is not Kueue's",
        ),
        (
            (UNRESERVED, cond("Requeued", "False", "EvictedByPodsReadyTimeout")),
            None,
            "a backoff: Kueue ends it itself",
        ),
    ],
)
def test_requeue_blocked(
    conditions: tuple[dict[str, str], ...], blocked: str | None, why: str
) -> None:
    assert traps.requeue_blocked(workload(*conditions)) == blocked, why


@given(
    st.recursive(
        st.none() | st.booleans() | st.text(max_size=5),
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_requeue_blocked_is_total_and_names_a_kueue_reason(junk: object) -> None:
    blocked = traps.requeue_blocked(junk)
    assert blocked is None or (
        blocked.startswith("DeactivatedDueTo") and blocked != "DeactivatedDueTo"
    )


@given(st.sampled_from([MET, RLE, "DeactivatedDueToAdmissionCheck"]), st.booleans())
def test_a_hold_on_top_of_kueues_deactivation_keeps_the_reason(reason: str, reserved: bool) -> None:
    """Property: Hold writes spec.active=false and annotations only; Kueue does not evict an
    evicted Workload again, so what was blocked before the hold is blocked after it."""
    before = workload(
        cond("Evicted", "True", reason),
        RESERVED if reserved else UNRESERVED,
        cond("Requeued", "False", reason),
    )
    held = copy.deepcopy(before)
    held["spec"]["active"] = False
    held["metadata"]["annotations"] = {"holdwarden.io/hold-instance": "1"}
    assert traps.requeue_blocked(held) == traps.requeue_blocked(before) == reason


def test_stranded_advice_names_the_workload_the_cause_and_what_to_do() -> None:
    text = traps.stranded_advice("team-a", "trainjob-job-1a2b3", MET)
    assert "team-a/trainjob-job-1a2b3" in text and MET in text
    assert "delete the Workload" in text and "v0.20" in text


def observation(
    state: State, blocked: str | None, active: bool, workload: str | None = "w"
) -> Observation:
    return Observation(
        ref=Ref("team-a", "job"),
        state=state,
        workload=workload,
        kueue_requeue_blocked=blocked,
        workload_active=active,
    )


@pytest.mark.parametrize(
    ("obs", "stranded"),
    [
        (observation(State.DEACTIVATED_BY_KUEUE, MET, True), True),
        (observation(State.WAITING_FOR_ADMISSION, MET, True), True),
        (observation(State.DEACTIVATED_BY_KUEUE, MET, False), True),  # deactivated again
        (observation(State.HELD, MET, False), False),
        (observation(State.DEACTIVATED_BY_KUEUE, None, True), False),
        (observation(State.RUNNING, MET, True), False),
        (observation(State.ENDED, MET, True), False),
        (observation(State.DEACTIVATED_BY_KUEUE, MET, True, workload=None), False),
    ],
)
def test_observation_stranded(obs: Observation, stranded: bool) -> None:
    assert obs.stranded is stranded
    assert obs.to_dict()["stranded"] is stranded
    assert obs.to_dict()["kueueRequeueBlocked"] == obs.kueue_requeue_blocked


def test_release_result_is_a_value_with_its_warnings() -> None:
    result = ReleaseResult(Ref("a", "b"), 3, MET, ("w",))
    assert result.to_dict() == {
        "ref": "a/b",
        "instance": 3,
        "kueueRequeueBlocked": MET,
        "warnings": ["w"],
    }


# ---- 2. the runtime ---------------------------------------------------------------------


def tj(runtime_ref: object, namespace: str = "team-a") -> dict[str, Any]:
    return {
        "metadata": {"name": "job", "namespace": namespace},
        "spec": {"runtimeRef": runtime_ref},
    }


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ({"name": "torch"}, RuntimeName("ClusterTrainingRuntime", "torch", None)),
        (
            {"name": "torch", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
            RuntimeName("TrainingRuntime", "torch", "team-a"),
        ),
        (
            {"name": "torch", "kind": "ClusterTrainingRuntime"},
            RuntimeName("ClusterTrainingRuntime", "torch", None),
        ),
        ({"name": "torch", "apiGroup": "example.com", "kind": "Other"}, None),
        ({"name": "torch", "kind": "Other"}, None),
        ({"name": ""}, None),
        ({}, None),
        ("torch", None),
    ],
)
def test_runtime_of(ref: object, expected: RuntimeName | None) -> None:
    assert traps.runtime_of(tj(ref)) == expected


def test_runtime_names_read_as_kubectl_would() -> None:
    assert str(RuntimeName("TrainingRuntime", "torch", "team-a")) == "TrainingRuntime team-a/torch"
    assert (
        str(RuntimeName("ClusterTrainingRuntime", "torch", None)) == "ClusterTrainingRuntime torch"
    )


# The refusals Trainer v2.3.0's webhook gives (pkg/runtime/core: field.Invalid on
# spec.runtimeRef / spec.RuntimeRef), as the API server words them.
TR_REFUSAL = (
    'admission webhook "validate.trainjob.trainer.kubeflow.org" denied the request: '
    'spec.runtimeRef: Invalid value: {"name":"torch","apiGroup":"trainer.kubeflow.org",'
    '"kind":"TrainingRuntime"}: trainingruntimes.trainer.kubeflow.org "torch" not found: '
    "specified trainingRuntime must be created before the TrainJob is created"
)
CTR_REFUSAL = (
    'admission webhook "validate.trainjob.trainer.kubeflow.org" denied the request: '
    'spec.RuntimeRef: Invalid value: {"name":"torch"}: clustertrainingruntimes.trainer.'
    'kubeflow.org "torch" not found: specified clusterTrainingRuntime must be created '
    "before the TrainJob is created"
)

KUEUE_REFUSAL = (
    "admission webhook \"vtrainjob.kb.io\" denied the request: runtime 'rt-ec52ce' not found"
)


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (422, TR_REFUSAL, True),
        (403, CTR_REFUSAL, True),
        (400, CTR_REFUSAL, True),
        (500, TR_REFUSAL, False),  # not a refusal: the webhook failed
        (422, TR_REFUSAL.replace("not found", "is forbidden"), False),  # Trainer could not read it
        (422, "spec.trainer: Invalid value: 3", False),
        (403, "held-trainjob-suspended: ...", False),
        (403, KUEUE_REFUSAL, True),  # Kueue's TrainJob webhook, seen on the real Kueue
        (500, KUEUE_REFUSAL, False),
    ],
)
def test_is_runtime_refusal(status: int, message: str, expected: bool) -> None:
    assert traps.is_runtime_refusal(status, message) is expected


def test_kueues_refusal_must_name_the_runtime_when_it_is_known() -> None:
    assert traps.is_runtime_refusal(403, KUEUE_REFUSAL, "rt-ec52ce")
    assert not traps.is_runtime_refusal(403, KUEUE_REFUSAL, "other")
    assert traps.is_runtime_refusal(422, TR_REFUSAL, "other")  # Trainer's names it otherwise


def test_runtime_missing_message_names_runtime_and_keeps_the_api_servers_words() -> None:
    runtime = RuntimeName("TrainingRuntime", "torch", "team-a")
    text = traps.runtime_missing_message("release team-a/job instance 2", runtime, TR_REFUSAL)
    assert text.startswith(
        "release team-a/job instance 2: TrainingRuntime team-a/torch does not exist"
    )
    assert "Re-create TrainingRuntime team-a/torch" in text and text.endswith(TR_REFUSAL)
    assert "The API server said" not in traps.runtime_missing_message("x", runtime, "")


TORCH = RuntimeName("ClusterTrainingRuntime", "torch", None)
LOCAL = RuntimeName("TrainingRuntime", "mine", "team-a")


@pytest.mark.parametrize(
    ("named", "present", "unseen", "supported", "says"),
    [
        ([], set(), [], True, "no TrainJob in team-a"),
        ([("a", TORCH), ("b", LOCAL)], {TORCH, LOCAL}, [], True, "names a runtime that exists"),
        (
            [("a", TORCH), ("b", LOCAL)],
            {TORCH},
            [],
            False,
            "TrainJob team-a/b names TrainingRuntime team-a/mine",
        ),
        (
            [("a", TORCH)],
            set(),
            ["clustertrainingruntimes"],
            True,
            "could not list clustertrainingruntimes",
        ),
        ([("a", TORCH), ("b", LOCAL)], set(), ["clustertrainingruntimes"], False, "team-a/b"),
    ],
)
def test_runtimes_capability(
    named: list[tuple[str, RuntimeName]],
    present: set[RuntimeName],
    unseen: list[str],
    supported: bool,
    says: str,
) -> None:
    cap = traps.runtimes_capability("team-a", named, frozenset(present), unseen=unseen)
    assert cap.supported is supported, cap.reason
    assert says in cap.reason


@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from([TORCH, LOCAL])), max_size=6),
    st.sets(st.sampled_from([TORCH, LOCAL])),
)
def test_runtimes_capability_fails_exactly_when_a_named_runtime_is_missing(
    named: list[tuple[str, RuntimeName]], present: set[RuntimeName]
) -> None:
    cap = traps.runtimes_capability("team-a", named, frozenset(present))
    assert cap.supported is all(rt in present for _, rt in named)


# ---- 3. a Trainer that ignores managedBy -----------------------------------------------


def load_crd(path: Path) -> dict[str, Any]:
    docs = list(yaml.safe_load_all(path.read_text()))
    crd: dict[str, Any] = next(d for d in docs if d and d.get("kind") == "CustomResourceDefinition")
    return crd


@cache
def _upstream_v23() -> dict[str, Any]:
    folder, kind = find_crd_dir()
    if kind == "minimal":
        pytest.skip("the upstream Trainer v2.3.0 CRDs (../shared/crds) are not here")
    return load_crd(folder / "trainer.kubeflow.org_trainjobs.yaml")


def trainjob_crd_v23() -> dict[str, Any]:
    """The real Trainer v2.3.0 TrainJob CRD (../shared/crds, what the rig installs)."""
    return copy.deepcopy(_upstream_v23())


@cache
def _v221() -> dict[str, Any]:
    return load_crd(CRDS / "trainer-v2.2.1" / "trainer.kubeflow.org_trainjobs.yaml")


def trainjob_crd_v221() -> dict[str, Any]:
    """The real Trainer v2.2.1 TrainJob CRD (tests/support/crds/trainer-v2.2.1, from its module)."""
    return copy.deepcopy(_v221())


def storage_uri(crd: dict[str, Any]) -> dict[str, Any]:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    uri: dict[str, Any] = spec["properties"]["initializer"]["properties"]["dataset"]["properties"][
        "storageUri"
    ]
    return uri


def test_the_fingerprint_is_the_one_difference_between_the_real_crds() -> None:
    assert storage_uri(trainjob_crd_v23())["x-kubernetes-validations"]
    assert "x-kubernetes-validations" not in storage_uri(trainjob_crd_v221())
    for crd in (trainjob_crd_v23(), trainjob_crd_v221()):  # both have the field
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert "managedBy" in spec["properties"]


def test_trainer_honours_managed_by() -> None:
    assert traps.trainer_honours_managed_by(trainjob_crd_v23()) is True
    assert traps.trainer_honours_managed_by(trainjob_crd_v221()) is False
    older = copy.deepcopy(trainjob_crd_v221())
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["managedBy"]
    assert traps.trainer_honours_managed_by(older) is False
    assert traps.trainer_honours_managed_by({}) is None
    other = copy.deepcopy(trainjob_crd_v23())
    other["spec"]["versions"][0]["name"] = "v1"
    assert traps.trainer_honours_managed_by(other) is None


@pytest.mark.parametrize(
    ("multikueue", "unseen", "trainer", "supported", "says"),
    [
        ([], [], None, True, "no MultiKueue in use seen here"),
        ([], ["admissionchecks: forbidden"], None, True, "could not read admissionchecks"),
        (["AdmissionCheck mk"], [], False, False, "upgrade Trainer to v2.3 or later"),
        (["MultiKueueCluster w1"], [], None, True, "unknown"),
        (["MultiKueueConfig c"], [], True, True, "honours spec.managedBy"),
    ],
)
def test_managed_by_capability(
    multikueue: list[str], unseen: list[str], trainer: bool | None, supported: bool, says: str
) -> None:
    cap = traps.managed_by_capability(multikueue, unseen, trainer, "why")
    assert cap.supported is supported
    assert says in cap.reason
    if not supported:
        assert multikueue[0] in cap.reason


@given(st.lists(st.text(min_size=1, max_size=5), max_size=3), st.sampled_from([True, False, None]))
def test_hold_is_refused_exactly_when_multikueue_is_seen_with_an_old_trainer(
    multikueue: list[str], trainer: bool | None
) -> None:
    cap = traps.managed_by_capability(multikueue, [], trainer, "why")
    assert cap.supported is not (bool(multikueue) and trainer is False)


def test_multikueue_evidence() -> None:
    checks = [
        {"metadata": {"name": "mk"}, "spec": {"controllerName": "kueue.x-k8s.io/multikueue"}},
        {"metadata": {"name": "gate"}, "spec": {"controllerName": "holdwarden.io/readmission"}},
    ]
    assert traps.multikueue_evidence(checks, [], []) == ["AdmissionCheck mk"]
    assert traps.multikueue_evidence(
        checks[1:], [{"metadata": {"name": "w1"}}], [{"metadata": {"name": "c"}}]
    ) == [
        "MultiKueueCluster w1",
        "MultiKueueConfig c",
    ]


# ---- 4. Kueue's force deletion and retention ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", KueueSettings(None, None)),
        (
            "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n",
            KueueSettings(None, None),
        ),
        ("featureGates:\n  FailureRecoveryPolicy: true\n", KueueSettings(True, None, True)),
        ("featureGates:\n  FailureRecoveryPolicy: false\n", KueueSettings(False, None, True)),
        # Gates, not this one: it is at its default (Kueue refuses --feature-gates beside).
        ("featureGates:\n  VisibilityOnDemand: false\n", KueueSettings(None, None, True)),
        ("featureGates: {}\n", KueueSettings(None, None, True)),
        # null is no mapping: Kueue accepts the flag then.
        ("featureGates:\n", KueueSettings(None, None, False)),
        (
            "objectRetentionPolicies:\n  workloads:\n    afterDeactivatedByKueue: 10m\n",
            KueueSettings(None, "10m"),
        ),
        (
            "objectRetentionPolicies:\n  workloads:\n    afterDeactivatedByKueue: null\n",
            KueueSettings(None, None),
        ),
    ],
)
def test_kueue_settings(text: str, expected: KueueSettings) -> None:
    assert traps.kueue_settings(text) == expected


@pytest.mark.parametrize("text", ["[1, 2]", "a: [", "- x"])
def test_kueue_settings_refuses_what_is_not_a_configuration(text: str) -> None:
    with pytest.raises(ValueError, match=r"controller_manager_config\.yaml"):
        traps.kueue_settings(text)


def pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations or {}}}


def test_annotated_for_force_delete() -> None:
    pods = [
        pod("b", {"kueue.x-k8s.io/safe-to-forcefully-delete": "true"}),
        pod("a", {"kueue.x-k8s.io/safe-to-forcefully-delete": "true"}),
        pod("c", {"kueue.x-k8s.io/safe-to-forcefully-delete": "false"}),
        pod("d"),
    ]
    assert traps.annotated_for_force_delete(pods) == ["a", "b"]


@pytest.mark.parametrize(
    ("annotated", "settings", "settings_error", "supported", "says"),
    [
        ([], KueueSettings(None, None), None, True, "--feature-gates flag"),
        ([], KueueSettings(None, None), None, True, "Helm chart"),
        # featureGates without the gate: Kueue refuses the flag beside them, so it is off
        # and nothing is unseen.
        ([], KueueSettings(None, None, feature_gates_set=True), None, True, "no pod here"),
        ([], KueueSettings(False, None), None, True, "no pod here opts in"),
        (
            ["p-0"],
            KueueSettings(False, None),
            None,
            False,
            "carry kueue.x-k8s.io/safe-to-forcefully-delete=true (p-0)",
        ),
        (
            [],
            KueueSettings(True, None),
            None,
            False,
            "turns on the FailureRecoveryPolicy feature gate",
        ),
        (
            [],
            None,
            "could not read ConfigMap kueue-system/kueue-manager-config: forbidden",
            True,
            "forbidden",
        ),
    ],
)
def test_force_delete_capability(
    annotated: list[str],
    settings: KueueSettings | None,
    settings_error: str | None,
    supported: bool,
    says: str,
) -> None:
    cap = traps.force_delete_capability("team-a", annotated, None, settings, settings_error)
    assert cap.supported is supported, cap.reason
    assert says in cap.reason


def test_retention_capability() -> None:
    assert traps.retention_capability(KueueSettings(None, None), None).supported
    unread = traps.retention_capability(None, "forbidden")
    assert unread.supported and "forbidden" in unread.reason
    set_ = traps.retention_capability(KueueSettings(None, "10m"), None)
    assert not set_.supported and "is 10m" in set_.reason
    # What it deletes, and why an upstream install of Kueue v0.19.2 only tries.
    assert "deletes a TrainJob 10m after deactivating it itself" in set_.reason
    assert "ClusterRole has no delete on trainjobs" in set_.reason
