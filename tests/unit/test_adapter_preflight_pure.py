"""holdwarden.adapter.preflight's pure part: what each probe's answer means, as table tests.

The probes themselves run against the real API server in
tests/controlplane/test_adapter_preflight.py (and tests/controlplane/test_adapter_kube.py);
here every reading of an answer is pinned with no server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from holdwarden.adapter import preflight
from holdwarden.adapter.preflight import (
    PLACEHOLDER_RUNTIME,
    EnforcerVerdict,
    GateProbe,
    QueueChecks,
    Refusal,
    RuntimeRef,
)
from holdwarden.adapter.steps import ApiStatusError, Http, Operation, Request, no_request
from holdwarden.adapter.types import Capability
from holdwarden.config import Config
from holdwarden.vocabulary import (
    BREAK_GLASS_GROUP,
    TRAINJOB,
    WORKLOAD,
    Annotations,
    RuleId,
)

A = Annotations("holdwarden.io")
GATE = "holdwarden.io/readmission"
DENIED = 'admission webhook "x" denied the request: runtime not found'


def test_runtime_ref_spec() -> None:
    assert PLACEHOLDER_RUNTIME.as_spec() == {"name": "holdwarden-preflight"}
    ref = RuntimeRef("torch", "trainer.kubeflow.org", "ClusterTrainingRuntime")
    assert ref.as_spec() == {
        "name": "torch",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({"allowed": True}, Capability(True, "may patch pods in ns"), id="allowed"),
        pytest.param({}, Capability(False, "may not patch pods in ns (RBAC)"), id="denied"),
        pytest.param(
            {"allowed": False, "reason": "no rule"},
            Capability(False, "may not patch pods in ns: no rule"),
            id="denied-with-reason",
        ),
        pytest.param(
            {"evaluationError": "webhook down"},
            Capability(False, "may not patch pods in ns: webhook down"),
            id="evaluation-error",
        ),
    ],
)
def test_access_capability(status: dict[str, Any], expected: Capability) -> None:
    assert preflight.access_capability("patch pods in ns", status) == expected


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (("ns", "patch", "kueue.x-k8s.io", "workloads"), "patch workloads.kueue.x-k8s.io in ns"),
        (("ns", "list", "", "pods"), "list pods in ns"),
    ],
)
def test_access_what(args: tuple[str, str, str, str], what: str) -> None:
    assert preflight.access_what(*args) == what


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_access_only_result_reports_the_one_review(mode: Any) -> None:
    held = Capability(True, "may patch it")
    result = preflight.access_only_result(mode, "ns", held)
    assert result.hold_supported
    assert result.hold_round_trip == Capability(True, f"{preflight.NOT_PROBED}; may patch it")
    probed = result.update_workloads if mode == "kueue" else result.update_trainjobs
    other = result.update_trainjobs if mode == "kueue" else result.update_workloads
    assert probed == held
    assert other == result.list_pods == result.enforcer_installed
    assert other == Capability(False, preflight.NOT_PROBED)


def _queue(name: str, *, gated: bool, multikueue: bool = False) -> QueueChecks:
    return QueueChecks(f"LocalQueue ns/{name} (ClusterQueue cq)", gated, multikueue)


@pytest.mark.parametrize(
    ("queues", "gate_ok", "multikueue_ok", "named"),
    [
        pytest.param([], False, True, [], id="no-queue"),
        pytest.param([_queue("a", gated=True)], True, True, [], id="gated"),
        pytest.param(
            [_queue("a", gated=True), _queue("b", gated=False)], False, True, ["b"], id="one-bare"
        ),
        pytest.param(
            [_queue("a", gated=False, multikueue=True)], False, False, ["a"], id="bare-multikueue"
        ),
        pytest.param(
            [_queue("a", gated=True, multikueue=True)], True, True, [], id="gated-multikueue"
        ),
    ],
)
def test_gate_probe(
    queues: list[QueueChecks], gate_ok: bool, multikueue_ok: bool, named: list[str]
) -> None:
    probe = preflight.gate_probe("ns", GATE, queues)
    assert probe.readmission_gate.supported is gate_ok
    assert probe.multikueue.supported is multikueue_ok
    for name in named:
        assert f"LocalQueue ns/{name} " in probe.readmission_gate.reason
    if not queues:
        assert probe.readmission_gate.reason.startswith("no LocalQueue in ns")


def test_gate_probe_unknown_says_why_for_both() -> None:
    assert GateProbe.unknown("why") == GateProbe(Capability(False, "why"), Capability(False, "why"))


@pytest.mark.parametrize(
    ("holders", "identity", "supported", "says"),
    [
        pytest.param((), None, False, "hold-owner-only is off", id="off"),
        pytest.param(("dispatch",), ("dispatch", []), True, "(dispatch) is a holder", id="user"),
        pytest.param(("ops",), ("me", ["ops"]), True, "is a holder", id="group"),
        pytest.param(("ops",), ("me", [BREAK_GLASS_GROUP]), True, "is a holder", id="break-glass"),
        pytest.param(("ops",), ("me", ["dev"]), False, "runs as me", id="not-a-holder"),
    ],
)
def test_ownership_capability(
    holders: tuple[str, ...],
    identity: tuple[str, list[str]] | None,
    supported: bool,
    says: str,
) -> None:
    got = preflight.ownership_capability(holders, identity)
    assert got.supported is supported and says in got.reason


def _held(mode: str) -> dict[str, Any]:
    marks = {A.hold_instance: "1", A.hold_reason: "r"}
    spec = {"active": False} if mode == "kueue" else {"suspend": True}
    return {"metadata": {"annotations": marks}, "spec": spec}


@pytest.mark.parametrize(
    ("mode", "echo", "supported", "says"),
    [
        pytest.param("kueue", _held("kueue"), True, "round-trips", id="kueue-kept"),
        pytest.param("plain", _held("plain"), True, "round-trips", id="plain-kept"),
        pytest.param(
            "kueue",
            {**_held("kueue"), "metadata": {"annotations": {A.hold_instance: "1"}}},
            False,
            f"annotations ['{A.hold_reason}']",
            id="annotation-dropped",
        ),
        pytest.param(
            "kueue", {**_held("kueue"), "spec": {}}, False, "spec.active=false", id="active-lost"
        ),
        pytest.param(
            "plain",
            {**_held("plain"), "spec": {"suspend": False}},
            False,
            "spec.suspend=true",
            id="suspend-lost",
        ),
    ],
)
def test_round_trip_capability(mode: Any, echo: dict[str, Any], supported: bool, says: str) -> None:
    resource = WORKLOAD if mode == "kueue" else TRAINJOB
    got = preflight.round_trip_capability(mode, resource, _held(mode), echo)
    assert got.supported is supported and says in got.reason


@pytest.mark.parametrize(
    ("refusal", "verdict"),
    [
        pytest.param(None, EnforcerVerdict.NOT_INSTALLED, id="accepted"),
        pytest.param(
            Refusal(403, "refused by held-workload-inactive", ""),
            EnforcerVerdict.INSTALLED,
            id="rule-in-message",
        ),
        pytest.param(
            Refusal(403, "denied", '{"reason": "held-workload-inactive"}'),
            EnforcerVerdict.INSTALLED,
            id="rule-in-body",
        ),
        pytest.param(Refusal(403, DENIED, ""), EnforcerVerdict.INCONCLUSIVE, id="someone-else"),
        pytest.param(
            Refusal(403, "refused by held-trainjob-suspended", ""),
            EnforcerVerdict.INCONCLUSIVE,
            id="the-other-mode's-rule",
        ),
    ],
)
def test_enforcer_verdict(refusal: Refusal | None, verdict: EnforcerVerdict) -> None:
    rule = preflight.enforcer_rule("kueue")
    assert rule == RuleId.HELD_WORKLOAD_INACTIVE.value
    assert preflight.enforcer_verdict(rule, refusal) is verdict
    got = preflight.enforcer_capability(rule, WORKLOAD, refusal)
    assert got.supported is (verdict is EnforcerVerdict.INSTALLED)
    if verdict is EnforcerVerdict.INCONCLUSIVE:
        assert got.reason.startswith("inconclusive")
    if verdict is EnforcerVerdict.NOT_INSTALLED:
        assert got.reason.endswith("no enforcer is installed")


@pytest.mark.parametrize(
    ("refusal", "hinted"),
    [
        pytest.param(Refusal(403, DENIED, ""), True, id="another-webhook"),
        pytest.param(Refusal(422, DENIED, ""), True, id="invalid"),
        pytest.param(Refusal(500, DENIED, ""), False, id="not-a-refusal"),
        pytest.param(Refusal(403, "forbidden: RBAC", ""), False, id="not-a-webhook"),
        pytest.param(
            Refusal(403, DENIED, RuleId.HELD_TRAINJOB_SUSPENDED.value), False, id="a-hold-rule"
        ),
    ],
)
def test_not_ours_hint(refusal: Refusal, hinted: bool) -> None:
    assert bool(preflight.not_ours_hint(refusal)) is hinted


def test_refusal_of_an_api_error() -> None:
    exc = ApiStatusError(403, "Forbidden", '{"message": "no"}')
    assert Refusal.of(exc) == Refusal(403, "no", '{"message": "no"}')


def test_no_request_is_an_operation_that_sends_nothing() -> None:
    operation: Operation[int] = no_request(7)
    with pytest.raises(StopIteration) as done:
        next(operation)
    assert done.value.value == 7


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_the_held_probe_body_is_correctly_held(mode: Any) -> None:
    def send(req: Request, deadline: datetime | None, http: Http) -> Operation[Any]:
        raise AssertionError(req)  # never called: building a body sends nothing

    at = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    probes = preflight.Preflight(Config(mode=mode, holder="dispatch"), A, lambda: at, send)
    resource, body = probes.held_probe_body("ns", PLACEHOLDER_RUNTIME)
    assert resource is (WORKLOAD if mode == "kueue" else TRAINJOB)
    assert body["metadata"]["annotations"] == {
        A.hold_instance: "1",
        A.hold_reason: "preflight hold round trip",
        A.held_at: "2026-12-03T12:00:00Z",
        A.held_by: "dispatch",
    }
    assert body["metadata"]["name"].startswith("holdwarden-preflight-")
    assert preflight.round_trip_capability(mode, resource, body, body).supported


# ---- kueueWithoutQueueName ---------------------------------------------------------------


def _wl(owner: str, queue: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"wl-{owner}",
            "ownerReferences": [
                {"kind": "TrainJob", "name": owner, "uid": "u", "controller": True}
            ],
        },
        "spec": {"queueName": queue} if queue else {},
    }


OFF = Config()
ON = Config.from_dict(
    {
        "kueue": {
            "manageJobsWithoutQueueName": True,
            "managedJobsNamespaceSelector": {"matchLabels": {"team": "ml"}},
        }
    }
)


@pytest.mark.parametrize(
    ("mode", "config", "ns_labels", "workloads", "supported", "says"),
    [
        ("kueue", OFF, None, [_wl("a", "lq")], True, "is false, and no"),
        ("kueue", OFF, None, None, True, "not scanned"),
        # Kueue made a Workload with no queue name: it manages unlabelled TrainJobs here.
        ("kueue", OFF, None, [_wl("b")], False, "ns/b has a Workload with no queue name"),
        ("plain", OFF, None, [_wl("b")], False, "is false"),
        ("kueue", ON, {"team": "ml"}, [], True, "here are Kueue's"),
        ("kueue", ON, {"team": "web"}, [], True, "here are not Kueue's"),
        ("plain", ON, {"team": "ml"}, [], False, "use mode: kueue here"),
        ("plain", ON, {"team": "web"}, None, True, "not selected"),
        # On, the namespace not selected, yet Kueue made a Workload for an unlabelled one.
        ("kueue", ON, {}, [_wl("c")], False, "set kueue.managedJobs"),
    ],
)
def test_queueless_capability(
    mode: Any,
    config: Config,
    ns_labels: dict[str, str] | None,
    workloads: list[dict[str, Any]] | None,
    supported: bool,
    says: str,
) -> None:
    got = preflight.queueless_capability(mode, config, "ns", ns_labels, workloads)
    assert got.supported is supported, got.reason
    assert says in got.reason


def test_queueless_capability_says_what_it_could_not_read() -> None:
    got = preflight.queueless_capability("kueue", ON, "ns", None, [], "could not read X")
    assert not got.supported
    assert "could not read X" in got.reason
