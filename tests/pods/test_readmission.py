"""The readmission component on the real node, with the real Kueue, Trainer, JobSet and
kube-controller-manager: the gate runs as the shipped Deployment's Pods, and nothing else
runs a gate.

Installed as docs/install.md says (an overlay of the base with the component
``readmission`` and the image, ``kubectl apply -k``), into a cluster where the rig's own
binding for the gate's identity is deleted first, so only the shipped RBAC authorizes the
gate's Pods. Then:

- both gate replicas Ready on the real node (their startup and readiness probes pass; no
  probe failure is reported), running as 65532:65532 on a root they cannot write; one of
  them holds the Lease ``holdwarden-readmission`` and renews it; the gate marks its
  AdmissionCheck Active, so the ClusterQueue that lists it admits.
- a Kueue-mode TrainJob (the supervisor's adapter, as in tests/real) whose trainer pod is a
  real container (the runtime's image overridden with the rig's pause image: nothing can be
  pulled) runs through the gate (``P/attempt`` 1); held, its pod is stopped by the kubelet
  but kept by a finalizer; released while it is kept, the gate keeps the job waiting
  ("pods of the previous execution remain", the TrainJob suspended, the Workload not
  admitted, ``P/attempt`` 1) for a bounded window; once the finalizer goes, the job is
  readmitted exactly once (``P/attempt`` 2 and no further), and pods of the two
  executions never exist together.
- each gate Pod's /metrics scraped from a Pod in the namespace ``monitoring``, through the
  node's network: during the wait the Lease holder reports itself leader and the one
  stalled Workload, the other replica a follower; after the readmission, the leader's
  decisions are counted and nothing is stalled.
- the leader's Pod deleted, the other replica takes the Lease.

The cluster is this module's own (a real node and the real controllers together, about a
minute more to start than either alone), stopped after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden import objects as hw_objects
from holdwarden.adapter import Adapter, Ref
from holdwarden.adapter.types import State
from holdwarden.config import Config
from holdwarden.vocabulary import ADMISSIONCHECK, Annotations
from rig.builders import trainjob_body
from rig.localcluster import GATE_IDENTITY, SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.images import PAUSE_IMAGE
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    PODS_REMAIN,
    Objects,
    condition,
    controller_refusals,
    eventually,
    make_queues,
    wait_local_queue_active,
    with_requests,
)
from tests.pods.conftest import report
from tests.pods.test_components import IMAGE, SCRAPER, import_project_image, overlay
from tests.pods.test_install_kustomize import (
    NAMESPACE,
    SELECTOR,
    diagnostics,
    failure_policies,
    kubectl,
    wait_for,
)  # fmt: skip
from tests.real.story import live_pod_sets, meta
from tests.support.actors import Watcher
from tests.support.rbac_helpers import may

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(1200)]

A = Annotations()
GATE = "holdwarden-readmission"  # the Deployment, its Lease, Service and AdmissionCheck
GATE_SELECTOR = "app.kubernetes.io/name=holdwarden,app.kubernetes.io/component=readmission"
# The rig binds the gate's identity to a test role of its own (rig/localcluster/rbac.py);
# this test deletes that binding, so that only the shipped RBAC authorizes the gate.
RIG_GATE_BINDING = "holdwarden-test:readmission-gate"
# How long the released job must be seen waiting while the held execution's pod remains
# (an assert that something does not happen: load makes it easier to pass, not harder).
# The gate decides on watch events, within a second when idle; its resync
# (readmission.interval, 30 s) is only a safety net behind them.
PODS_KEPT_S = 15.0
RECONCILES = "holdwarden_readmission_reconciles_total"


@pytest.fixture(scope="module")
def gate_cluster() -> Iterator[LocalCluster]:
    """A real node and the real controllers on one control plane, for this module only."""
    started = time.monotonic()
    local = LocalCluster(pods=True, controllers=CONTROLLERS)
    local.start()
    report(
        f"readmission: real node and real controllers started in "
        f"{time.monotonic() - started:.1f}s "
        + ", ".join(f"{k} {v:.1f}s" for k, v in local.phase_seconds.items())
    )
    try:
        yield local
    finally:
        local.stop()


def gate_pods(core: k8s.CoreV1Api) -> list[Any]:
    """The gate's Pods that are not being deleted."""
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=GATE_SELECTOR)
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def lease_holder(coordination: k8s.CoordinationV1Api) -> tuple[str, Any] | None:
    """(the holder's Pod name, the Lease's renewTime), or None while nobody holds it.
    The gate's identity is ``<hostname>_<random>`` and a Pod's hostname is its name."""
    try:
        lease: Any = coordination.read_namespaced_lease(GATE, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    holder = lease.spec.holder_identity
    if not holder:
        return None
    return str(holder).rsplit("_", 1)[0], lease.spec.renew_time


def check_active(custom: k8s.CustomObjectsApi) -> bool:
    check: Any = custom.get_cluster_custom_object(
        ADMISSIONCHECK.group, ADMISSIONCHECK.version, ADMISSIONCHECK.plural, GATE
    )
    return (condition(check, "Active") or {}).get("status") == "True"


def pause_trainjob(namespace: str) -> dict[str, Any]:
    """A Kueue-mode TrainJob whose one trainer pod is the rig's pause image (on the node
    already, never pulled: its tag is not ``latest``, so the policy is IfNotPresent)."""
    body = with_requests(trainjob_body("job", queue=LOCAL_QUEUE, suspend=True))
    body["metadata"]["namespace"] = namespace
    body["spec"]["trainer"]["image"] = PAUSE_IMAGE.reference
    return body


def container_ended(objects: Objects, name: str) -> bool:
    """Pod ``name`` is being deleted and the kubelet has stopped its container (the pod
    object itself stays while a finalizer keeps it)."""
    pod: Any = k8s.CoreV1Api(objects.admin).read_namespaced_pod(name, objects.namespace)
    statuses = pod.status.container_statuses or []
    return bool(
        pod.metadata.deletion_timestamp
        and statuses
        and all(s.state.terminated is not None for s in statuses)
    )


def start_scraper(cluster: LocalCluster, core: k8s.CoreV1Api, tag: str) -> str:
    """A Pod of the project's image in the namespace ``monitoring`` (where the gate's
    NetworkPolicy admits scrapes from) that sleeps; scrapes are run in it. Its name."""
    namespace = cluster.create_namespace("monitoring")
    pod: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "scrape"},
        "spec": {
            # python3 as PID 1 ignores SIGTERM: no grace to wait out at the cluster's stop.
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "scrape",
                "image": f"{IMAGE}:{tag}",
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", "import time; time.sleep(3600)"],
            }],
        },
    }  # fmt: skip
    core.create_namespaced_pod(namespace, pod)

    def running() -> bool:
        found: Any = core.read_namespaced_pod("scrape", namespace)
        return bool(found.status.phase == "Running")

    wait_for(cluster, "the scraper Pod Running", running, 120)
    return namespace


def scrape(cluster: LocalCluster, core: k8s.CoreV1Api, scraper: str) -> dict[str, str]:
    """Each gate Pod's /metrics as the monitoring component's ServiceMonitor has them
    scraped: every ready address of the Service ``holdwarden-readmission``, on its port
    ``metrics``, GET from the scraper Pod through the node's network. {Pod name: body};
    fails unless both replicas answer 200."""
    endpoints: Any = core.read_namespaced_endpoints(GATE, NAMESPACE)
    targets: dict[str, str] = {}
    for subset in endpoints.subsets or []:
        (port,) = [p.port for p in subset.ports if p.name == "metrics"]
        for address in subset.addresses or []:
            targets[f"http://{address.ip}:{port}/metrics"] = address.target_ref.name
    assert len(targets) == 2, f"the gate's Service has not two ready endpoints: {endpoints}"
    out = kubectl(
        cluster, "-n", scraper, "exec", "scrape", "--",
        "python3", "-c", SCRAPER, json.dumps(sorted(targets)),
    )  # fmt: skip
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["target"] for r in results) == sorted(targets), out[-3000:]
    for result in results:
        assert result["status"] == 200, result
    return {targets[r["target"]]: str(r["body"]) for r in results}


def sample(body: str, name: str, labels: str = "") -> float:
    """The sum of the samples of series ``name`` whose label set contains ``labels``."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{", 1)[0] == name and labels in series:
            total += float(value)
    return total


def test_the_gate_deployment_keeps_a_released_job_waiting_until_its_pods_are_gone(
    gate_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = gate_cluster
    admin = cluster.api_client()
    core = k8s.CoreV1Api(admin)
    apps = k8s.AppsV1Api(admin)
    custom = k8s.CustomObjectsApi(admin)
    coordination = k8s.CoordinationV1Api(admin)

    # Only the shipped RBAC may authorize the gate: the rig's binding goes first.
    k8s.RbacAuthorizationV1Api(admin).delete_cluster_role_binding(RIG_GATE_BINDING)
    with cluster.api_client(GATE_IDENTITY) as as_gate:
        eventually(
            lambda: not may(as_gate, "list", "pods"), "the rig's gate binding out of force", 30
        )

    tag = import_project_image(cluster)
    folder = overlay(tmp_path / "overlays" / "gated", tag, "readmission")
    kept: str | None = None
    objects: Objects | None = None
    watcher: Watcher | None = None
    supervisor = cluster.api_client(SUPERVISOR_IDENTITY)
    try:
        applied_at = time.monotonic()
        applied_wall = time.time()
        kubectl(cluster, "apply", "-k", str(folder))

        def gates_ready() -> bool:
            deployment: Any = apps.read_namespaced_deployment(GATE, NAMESPACE)
            pods = gate_pods(core)
            return (deployment.status.ready_replicas or 0) == 2 and (
                len(pods) == 2 and all(is_ready(p) for p in pods)
            )

        wait_for(cluster, "both gate replicas Ready", gates_ready, 300)
        gates_ready_s = time.monotonic() - applied_at
        pods = gate_pods(core)
        for pod in pods:
            report(start_timeline(core, pod, applied_wall))
        for pod in pods:
            (container,) = pod.spec.containers
            assert container.name == "gate" and container.args[0] == "gate", container.args
            assert container.image == f"{IMAGE}:{tag}"
            assert container.security_context.read_only_root_filesystem is True
            (status,) = pod.status.container_statuses
            # The startup probe passed (started), then the readiness probe (ready).
            assert status.started is True and status.ready is True, status
            name = pod.metadata.name

            def in_gate(*command: str, pod_name: str = name) -> str:
                return kubectl(cluster, "-n", NAMESPACE, "exec", pod_name, "-c", "gate", "--",
                               *command)  # fmt: skip

            ids = in_gate("python3", "-c", "import os; print(os.getuid(), os.getgid())")
            assert ids.split() == ["65532", "65532"], ids
            probe = in_gate(
                "python3", "-c",
                "import os\ntry:\n    open('/probe', 'w')\nexcept OSError as e:\n"
                "    print(e.errno)\nelse:\n    print('written')",
            )  # fmt: skip
            assert probe.strip() == "30", f"the root is writable in {name}: {probe}"  # EROFS
        names = {p.metadata.name for p in pods}

        # One replica holds the Lease, and renews it.
        holder, renewed = wait_for(
            cluster, "a gate Pod holds the Lease", lambda: lease_holder(coordination), 60
        )
        assert holder in names, (holder, names)
        wait_for(
            cluster, "the Lease renewed",
            lambda: (now := lease_holder(coordination)) is not None and now[1] > renewed, 30,
        )  # fmt: skip
        # The PodDisruptionBudget counts both replicas and lets one be disrupted.
        policy = k8s.PolicyV1Api(admin)

        def budget() -> bool:
            pdb: Any = policy.read_namespaced_pod_disruption_budget(GATE, NAMESPACE)
            status = pdb.status
            return bool(status and status.current_healthy == 2 and status.disruptions_allowed == 1)

        wait_for(cluster, "the gate's PodDisruptionBudget allows one disruption", budget, 60)
        wait_for(cluster, "the gate marks its AdmissionCheck Active",
                 lambda: check_active(custom), 60)  # fmt: skip
        # The enforcer judges the story's writes, as in a user's cluster.
        wait_for(cluster, "failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 180)
        scraper = start_scraper(cluster, core, tag)

        team = cluster.create_namespace(f"team-gate-{int(time.time()) % 100000}")
        make_queues(admin, team, admission_checks=[GATE])
        wait_local_queue_active(admin, team)
        objects = Objects(admin, team)
        watcher = Watcher(admin, team)
        watcher.start()
        adapter = Adapter(Config(mode="kueue"), supervisor)
        ref = adapter.start(pause_trainjob(team), meta())
        assert ref == Ref(team, "job")
        adapter.open(ref, meta())

        running = eventually(
            lambda: objects.running_on_nodes(1), "the first execution's pod Running on the node"
        )
        first = set(running)
        eventually(lambda: objects.attempt() == "1", "the gate records attempt 1")
        through_gate = adapter.observe(ref)
        assert (GATE, "Ready") in through_gate.admission_checks, through_gate
        assert not through_gate.ungated_admission, through_gate

        (pod,) = objects.pods()
        kept = objects.keep(pod)
        adapter.hold(ref, meta(1), "gate pod test")
        eventually(objects.suspended, "Kueue suspends the TrainJob")
        eventually(
            lambda: container_ended(objects, kept or ""),
            "the kubelet stops the held pod's container (the pod kept by its finalizer)",
        )
        assert adapter.observe(ref).state is State.HELD

        adapter.release(ref, meta(1))
        released_at = time.monotonic()
        eventually(
            lambda: objects.check_message(GATE, PODS_REMAIN),
            "the gate says the held execution's pod remains",
        )
        # The gate Pods' own view, through the node: the Lease holder leads and counts the
        # job as stalled; the other replica follows.
        bodies = scrape(cluster, core, scraper)
        leader = lease_holder(coordination)
        assert leader is not None and leader[0] in bodies, (leader, sorted(bodies))
        for name, body in bodies.items():
            leading = name == leader[0]
            assert sample(body, "holdwarden_readmission_leader") == (1.0 if leading else 0.0)
            if leading:
                assert sample(body, "holdwarden_readmission_stalled_workloads") == 1.0, body
                kept_pending = sample(body, RECONCILES, 'outcome="keep-pending"')
                assert kept_pending >= 1, body
        # Not readmitted while the pod remains.
        until = released_at + PODS_KEPT_S
        while time.monotonic() < until:
            assert objects.suspended(), "re-admitted while the held execution's pod remains"
            assert objects.attempt() == "1", objects.attempt()
            admitted = condition(objects.workload(), "Admitted")
            assert (admitted or {}).get("status") != "True", admitted
            assert objects.pod_uids() == first, "a pod of a new execution while the old remains"
            time.sleep(0.5)
        assert objects.check_message(GATE, PODS_REMAIN), objects.workload()

        let_go_at = time.monotonic()
        objects.let_go(kept)
        kept = None
        eventually(lambda: not objects.suspended(), "re-admitted once the held pod is gone")
        readmitted_s = time.monotonic() - let_go_at

        def second_running() -> set[str]:
            now = objects.running_on_nodes(1) or {}
            return set(now) - first

        second = eventually(second_running, "the second execution's pod Running on the node")
        eventually(lambda: objects.attempt() == "2", "the gate records attempt 2")
        # Exactly once: a second raise would show within a few of the gate's passes.
        time.sleep(5)
        assert objects.attempt() == "2"
        assert hw_objects.recorded_grant(objects.workload(), A) == 2

        bodies = scrape(cluster, core, scraper)
        leader = lease_holder(coordination)
        assert leader is not None and leader[0] in bodies, (leader, sorted(bodies))
        body = bodies[leader[0]]
        assert sample(body, "holdwarden_readmission_stalled_workloads") == 0.0, body
        granted = sum(
            sample(body, RECONCILES, f'outcome="{o}"') for o in ("mark-ready", "raise-attempt")
        )
        assert granted >= 1, body
        watcher.stop()
        events = watcher.events()
        watcher = None
        for live in live_pod_sets(events):
            assert not (live & first and live & second), "pods of two executions at once"
        assert [e for e in events if e.kind == "workload" and e.type == "DELETED"] == []
        # The installed enforcer refused none of the controllers' writes (its audit lines
        # are in its Pods' stdout).
        assert controller_refusals(enforcer_audit(core)) == []
        assert_no_gate_restarts(core)

        # The leader's Pod deleted (SIGTERM through the kubelet): a live replica takes the
        # Lease, with the shipped RBAC's update on it. Either may win: the leader releases
        # the Lease on SIGTERM, and the ReplicaSet's replacement campaigns at its start
        # while the other replica retries every retryPeriod (2-2.4 s); the replacement won
        # in one quiet run of four.
        (old_leader, _) = leader
        (follower,) = set(bodies) - {old_leader}
        deleted_at = time.monotonic()
        core.delete_namespaced_pod(old_leader, NAMESPACE)

        def taken_over() -> str | None:
            now = lease_holder(coordination)
            live = {p.metadata.name for p in gate_pods(core)}
            return now[0] if now is not None and now[0] != old_leader and now[0] in live else None

        new_leader = wait_for(
            cluster, f"a live gate Pod takes the Lease from the deleted {old_leader}",
            taken_over, 60,
        )  # fmt: skip
        takeover_s = time.monotonic() - deleted_at
        taker = "the other replica" if new_leader == follower else "the replacement Pod"
        report(
            f"readmission: both gate Pods Ready {gates_ready_s:.1f}s after the apply; "
            f"the released job kept waiting {PODS_KEPT_S:.0f}s while its pod remained, "
            f"readmitted {readmitted_s:.1f}s after the pod's finalizer went; the Lease "
            f"taken over by {taker} {takeover_s:.1f}s after the leader's Pod was deleted"
        )
    except BaseException:
        print(diagnostics(cluster))
        raise
    finally:
        if watcher is not None:
            watcher.stop()
        if kept is not None and objects is not None:
            objects.let_go(kept)
        supervisor.close()  # type: ignore[no-untyped-call]
        admin.close()  # type: ignore[no-untyped-call]


def start_timeline(core: k8s.CoreV1Api, pod: Any, since: float) -> str:
    """Where a gate Pod's start went, in seconds after ``since`` (the apply): made,
    scheduled, its container started, its first log line, Ready. Whole seconds but for the
    log line: the API's timestamps are. Under a loaded machine the gate Pods have taken up to
    138 s to be Ready, and this says which step took it."""

    def offset(moment: Any) -> str:
        return "?" if moment is None else f"{moment.timestamp() - since:+.1f}s"

    conditions = {c.type: c.last_transition_time for c in pod.status.conditions or []}
    (status,) = pod.status.container_statuses
    started = status.state.running.started_at if status.state.running else None
    first_log = "?"
    log = str(core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, limit_bytes=4096))
    for line in log.splitlines():
        try:
            moment = datetime.fromisoformat(json.loads(line)["time"])
        except (ValueError, KeyError, TypeError):
            continue
        first_log = offset(moment)
        break
    return (
        f"readmission: gate Pod {pod.metadata.name} after the apply: made "
        f"{offset(pod.metadata.creation_timestamp)}, scheduled "
        f"{offset(conditions.get('PodScheduled'))}, container started {offset(started)}, "
        f"first log line {first_log}, Ready {offset(conditions.get('Ready'))}"
    )


def enforcer_audit(core: k8s.CoreV1Api) -> list[dict[str, Any]]:
    """The refusals the enforcer Pods logged (``"audit": true`` lines on stdout)."""
    records: list[dict[str, Any]] = []
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
    for pod in pods.items:
        log = str(core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE))
        for line in log.splitlines():
            if line.startswith("{"):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("audit") is True:
                    records.append(dict(entry))
    return records


def assert_no_gate_restarts(core: k8s.CoreV1Api) -> None:
    """No gate container was restarted (its liveness probe failing three times in a row, or
    a crash): a restart loses the Lease and the watch caches. A single probe that timed
    out is reported, not failed: under two busy loops on two cores the gate's event loop
    has answered a probe later than its 5 s timeout (docs/performance/cold-make-test.md)."""
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=GATE_SELECTOR)
    restarted = {
        p.metadata.name: s.restart_count
        for p in pods.items
        for s in p.status.container_statuses or []
        if s.restart_count
    }
    events: Any = core.list_namespaced_event(NAMESPACE)
    unhealthy = [
        e
        for e in events.items
        if e.reason == "Unhealthy" and e.involved_object.name.startswith(f"{GATE}-")
    ]
    # An Event counts repeats of itself (``count``) rather than recurring.
    missed = [e.message for e in unhealthy if "Startup" not in e.message]
    starting = sum(e.count or 1 for e in unhealthy if "Startup" in e.message)
    report(
        f"readmission: gate probes missed (not restarted): {len(missed)} readiness or "
        f"liveness; {starting} startup probes failed while the process started"
    )
    assert pods.items, "no gate Pod"
    assert restarted == {}, (restarted, missed)
