"""The enforcer under disruption on the real node, while a writer keeps writing held objects.

One cluster, one install for the module: ``helm install`` of the chart as docs/install.md
says (the Namespace with its Pod Security labels first), so that ``helm upgrade`` is the
user's own path; every other disruption is what an operator or the cluster does with
kubectl or to the container. A writer runs from the install to the uninstall, three
threads each writing a few times a second (so that the apiserver keeps several connections
to the enforcer and dials new ones as Pods come and go): a held TrainJob and a held
Workload of its own (an annotation the rules allow; both carry the hold, so the apiserver
sends every one of these writes to the enforcer), a TrainJob with no hold (never sent),
and a server-side dry run of its held TrainJob's unsuspend, which the enforcer must refuse
(it is live). Each outcome is
classified: allowed; wrongly refused (the enforcer denied a write its rules allow); failed
(any other error: the webhook unreachable is the apiserver's 500 with ``failurePolicy:
Fail``). The apiserver's own counter of calls to ``enforcer.holdwarden.io`` shows that the
writes were judged, not skipped.

Disruptions, in order, each with no write wrongly refused and (but 3 and 5) none failed:

1. ``kubectl rollout restart`` (to the old Pods' deletion);
2. ``helm upgrade`` with a changed configuration value (the Pods roll on
   ``checksum/config`` and serve it; ``failurePolicy`` stays ``Fail``);
3. SIGKILL of one enforcer container through the node's containerd: the kubelet restarts
   it and the Service stops routing to it until it is Ready again (readiness). A killed
   process cannot drain: the writes on the wire to it, and any sent there before the
   Service stops routing to it, fail (the apiserver does not retry a webhook's POST); so
   here failures are allowed, but only "could not call the webhook" (connection reset or
   refused), and none once the Pod is Ready again (the count is printed);
4. ``kubectl drain`` of the one node: the PodDisruptionBudget lets one Pod be evicted and
   refuses the second while the replacement cannot be scheduled (the node is cordoned);
   the drain makes no progress meanwhile and one Pod stays Ready; after the uncordon the
   replacement runs, the drain finishes and both Pods are Ready;
5. scale to 0 and back: while no Pod runs, writes to objects without a hold still succeed
   (``matchConditions``), writes to held objects fail and the held unsuspend is refused
   (docs/install.md, "When the webhook is down": every write the webhook matches), and all
   is served again once the Pods are back.

After each, a real held unsuspend is refused and its audit line is in a Pod's stdout.
Counts and times are printed in the run's summary.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.vocabulary import TRAINJOB, WORKLOAD
from rig import image as image_build
from rig.builders import trainjob_body, workload_body
from rig.localcluster import LocalCluster
from tests.pods.conftest import report
from tests.pods.test_install_helm import CHART, helm
from tests.pods.test_install_kustomize import (
    HOLD,
    MANIFESTS,
    NAMESPACE,
    SELECTOR,
    WEBHOOK,
    failure_policies,
    kubectl,
    ready_pods,
    wait_for,
)  # fmt: skip
from tests.support.tool_binaries import ensure_kubectl

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(2400)]

TEAM = "team-disrupt"
HOOK_NAME = "enforcer.holdwarden.io"
DENIED = f'admission webhook "{HOOK_NAME}" denied'
UNREACHABLE = f'failed calling webhook "{HOOK_NAME}"'
HEARTBEAT = "example.com/heartbeat"  # not a hold key: the rules allow changing it
FREE = "free-job"  # no hold: never sent to the enforcer
WORKERS = 3  # the writer's threads
# Writer rounds that must complete after a disruption's end (each round: three writes
# and a probe), so that the window also covers the first writes to the new state.
AFTER_ROUNDS = 10


def message(exc: ApiException) -> str:
    """The Status message of an API error (its body is JSON, quotes escaped), else the
    body as it is."""
    body = str(exc.body)
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body


@dataclass
class Outcome:
    at: float  # time.monotonic()
    target: str  # held (a held object's write), free (an object with no hold), probe
    result: str  # allowed, wrongly-refused, failed; a probe: refused, accepted, failed
    detail: str = ""
    began: float = 0.0  # the request's start


def held_names(worker: int) -> tuple[tuple[str, Any], ...]:
    return ((f"held-job-{worker}", TRAINJOB), (f"held-workload-{worker}", WORKLOAD))


@dataclass
class Writer:
    """``WORKERS`` threads, each writing its own held objects (and one without a hold) and
    probing, until stopped; concurrent, so that the apiserver keeps several connections
    to the enforcer and dials new ones as Pods come and go."""

    cluster: LocalCluster
    outcomes: list[Outcome] = field(default_factory=list)
    rounds: list[int] = field(default_factory=lambda: [0] * WORKERS)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for worker in range(WORKERS):
            thread = threading.Thread(target=self.run, args=(worker,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def run(self, worker: int) -> None:
        with self.cluster.api_client() as api:
            custom = k8s.CustomObjectsApi(api)
            while not self.stop.is_set():
                n = self.rounds[worker] + 1
                patch = {"metadata": {"annotations": {HEARTBEAT: str(n)}}}
                for name, coords in held_names(worker):
                    self._write(custom, "held", name, coords, patch)
                self._write(custom, "free", f"{FREE}-{worker}", TRAINJOB, patch)
                self._probe(custom, f"held-job-{worker}")
                with self.lock:
                    self.rounds[worker] = n
                self.stop.wait(0.1)

    def _record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def _write(
        self,
        custom: k8s.CustomObjectsApi,
        target: str,
        name: str,
        coords: Any,
        patch: dict[str, Any],
    ) -> None:
        began = time.monotonic()
        try:
            custom.patch_namespaced_custom_object(
                coords.group, coords.version, TEAM, coords.plural, name, patch,
                _request_timeout=30,
            )  # fmt: skip
        except ApiException as exc:
            body = message(exc)
            wrong = exc.status == 403 and DENIED in body
            result = "wrongly-refused" if wrong else "failed"
            detail = f"{name} {exc.status}: {body}"[:500]
            self._record(Outcome(time.monotonic(), target, result, detail, began))
        except Exception as exc:  # the connection itself: failed as well
            detail = f"{name} {exc!r}"[:500]
            self._record(Outcome(time.monotonic(), target, "failed", detail, began))
        else:
            self._record(Outcome(time.monotonic(), target, "allowed", "", began))

    def _probe(self, custom: k8s.CustomObjectsApi, name: str) -> None:
        began = time.monotonic()
        try:
            custom.patch_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, name,
                {"spec": {"suspend": False}}, dry_run="All", _request_timeout=30,
            )  # fmt: skip
        except ApiException as exc:
            body = message(exc)
            refused = exc.status == 403 and DENIED in body and "held-trainjob-suspended" in body
            result = "refused" if refused else "failed"
            detail = f"{exc.status}: {body}"[:500]
            self._record(Outcome(time.monotonic(), "probe", result, detail, began))
        except Exception as exc:
            self._record(Outcome(time.monotonic(), "probe", "failed", repr(exc)[:500], began))
        else:
            self._record(Outcome(time.monotonic(), "probe", "accepted", "", began))

    def window(self, start: float, end: float) -> list[Outcome]:
        with self.lock:
            return [o for o in self.outcomes if start <= o.at <= end]

    def completed_rounds(self) -> int:
        """Rounds every worker has completed."""
        with self.lock:
            return min(self.rounds)


@dataclass
class Tally:
    held_allowed: int = 0
    wrongly_refused: int = 0
    failed: int = 0
    free_allowed: int = 0
    free_failed: int = 0
    probes_refused: int = 0
    probes_accepted: int = 0
    samples: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"held writes allowed {self.held_allowed}, wrongly refused "
            f"{self.wrongly_refused}, failed {self.failed}; no-hold writes allowed "
            f"{self.free_allowed}, failed {self.free_failed}; held-unsuspend probes refused "
            f"{self.probes_refused}, accepted {self.probes_accepted}"
        )


def latencies(outcomes: list[Outcome]) -> str:
    """The writes' latency (request to answer, as the writer saw it): median, p99, max."""
    took = sorted(o.at - o.began for o in outcomes)
    if not took:
        return "no writes"
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
    return f"latency median {took[len(took) // 2]:.2f}s p99 {p99:.2f}s max {took[-1]:.2f}s"


def tally(outcomes: list[Outcome]) -> Tally:
    t = Tally()
    for o in outcomes:
        if o.target == "free":
            if o.result == "allowed":
                t.free_allowed += 1
            else:
                t.free_failed += 1
                t.samples.append(f"{o.target} {o.result} {o.detail}")
        elif o.target == "probe":
            if o.result == "refused":
                t.probes_refused += 1
            elif o.result == "accepted":
                t.probes_accepted += 1
            else:
                t.failed += 1
                t.samples.append(f"probe {o.detail}")
        elif o.result == "allowed":
            t.held_allowed += 1
        else:
            if o.result == "wrongly-refused":
                t.wrongly_refused += 1
            else:
                t.failed += 1
            t.samples.append(f"{o.target} {o.result} {o.detail}")
    return t


_METRIC = re.compile(r"^(apiserver_admission_webhook_\w+)\{([^}]*)\} (\S+)$")


def webhook_calls(cluster: LocalCluster) -> dict[str, float]:
    """The apiserver's own counts of its calls to the enforcer: answered and allowed,
    answered and refused, and calls that failed (the webhook could not be called)."""
    text = kubectl(cluster, "get", "--raw", "/metrics", timeout=60)
    counts = {"allowed": 0.0, "refused": 0.0, "call-errors": 0.0}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match is None or f'name="{HOOK_NAME}"' not in match.group(2):
            continue
        metric, labels, value = match.groups()
        if metric == "apiserver_admission_webhook_request_total" and 'code="200"' in labels:
            key = "refused" if 'rejected="true"' in labels else "allowed"
            counts[key] += float(value)
        elif (
            metric == "apiserver_admission_webhook_rejection_count"
            and 'error_type="calling_webhook_error"' in labels
        ):
            counts["call-errors"] += float(value)
    return counts


@dataclass
class Installed:
    cluster: LocalCluster
    helm_home: Path
    values: list[str]
    admin: k8s.ApiClient
    writer: Writer

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.admin)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.admin)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.admin)

    def wait(self, what: str, check: Any, seconds: float = 300) -> Any:
        return wait_for(self.cluster, what, check, seconds)

    def rounds_after(self, count: int = AFTER_ROUNDS) -> None:
        """Wait until the writer has completed ``count`` more rounds."""
        target = self.writer.completed_rounds() + count
        alive = self.writer.completed_rounds

        self.wait(f"{count} more writer rounds", lambda: alive() >= target, 180)

    def both_ready(self) -> bool:
        deployment: Any = self.apps.read_namespaced_deployment("holdwarden", NAMESPACE)
        pods: Any = self.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
        return (
            (deployment.status.ready_replicas or 0) == 2
            and len(ready_pods(self.core)) == 2
            and len(pods.items) == 2  # none terminating, none pending
        )

    def pod_names(self) -> set[str]:
        pods: Any = self.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
        return {p.metadata.name for p in pods.items}

    def refused_with_audit_line(self, name: str) -> None:
        """A real (not dry-run) unsuspend of held TrainJob ``name`` is refused by the
        enforcer, and its audit line is in a Ready Pod's stdout."""
        try:
            self.custom.patch_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, name,
                {"spec": {"suspend": False}}, _request_timeout=30,
            )  # fmt: skip
        except ApiException as exc:
            body = message(exc)
            assert exc.status == 403 and DENIED in body, body
            assert "[held-trainjob-suspended]" in body, body
        else:
            pytest.fail(f"the unsuspend of held {name} was accepted")

        def audit_line() -> dict[str, Any] | None:
            for pod in ready_pods(self.core):
                log = self.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
                for line in str(log).splitlines():
                    if not line.startswith('{"audit"'):
                        continue
                    entry = json.loads(line)
                    if entry.get("name") == name and entry.get("namespace") == TEAM:
                        return dict(entry)
            return None

        entry = self.wait(f"the audit line of {name}'s refusal", audit_line, 60)
        assert entry["rule"] == "held-trainjob-suspended", entry
        assert entry["dryRun"] is False, entry


def held_trainjob(custom: k8s.CustomObjectsApi, name: str) -> None:
    job = trainjob_body(name, suspend=True)
    job["metadata"]["annotations"] = dict(HOLD)
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, job
    )


PHASE_JOBS = ("held-restart", "held-upgrade", "held-kill", "held-drain", "held-scale")


@pytest.fixture(scope="module")
def installed(
    pods_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    cluster = pods_cluster
    built = image_build.build_image(quiet=True)
    cluster.import_image(built.archive)
    values = ["--set", "image.repository=docker.io/library/holdwarden",
              "--set", f"image.tag={built.version}"]  # fmt: skip
    admin = cluster.api_client()
    custom = k8s.CustomObjectsApi(admin)
    cluster.create_namespace(TEAM)
    for name in PHASE_JOBS:
        held_trainjob(custom, name)
    for worker in range(WORKERS):
        held_trainjob(custom, f"held-job-{worker}")
        workload = workload_body(f"held-workload-{worker}", active=False)
        workload["metadata"]["annotations"] = dict(HOLD)
        custom.create_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, TEAM, WORKLOAD.plural, workload
        )
        custom.create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural,
            trainjob_body(f"{FREE}-{worker}", suspend=True),
        )  # fmt: skip
    helm_home = tmp_path_factory.mktemp("helm")
    writer = Writer(cluster)
    state = Installed(cluster, helm_home, values, admin, writer)
    assert cluster.node is not None
    node = cluster.node.name
    try:
        kubectl(cluster, "apply", "-f", str(MANIFESTS / "namespace.yaml"))
        started = time.monotonic()
        helm(cluster, helm_home, "install", "holdwarden", str(CHART), "-n", NAMESPACE, *values)
        state.wait("both enforcer replicas Ready", state.both_ready, 300)
        state.wait("failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 180)
        report(
            f"disruptions: helm install, both Ready and failurePolicy Fail "
            f"{time.monotonic() - started:.1f}s after the install"
        )
        writer.start()
        state.rounds_after()
        yield state
    finally:
        writer.join()
        kubectl(cluster, "uncordon", node, timeout=60)
        # Uninstall as docs/install.md says for Helm.
        kubectl(cluster, "delete", "validatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")
        helm(cluster, helm_home, "uninstall", "holdwarden", "-n", NAMESPACE, "--wait")
        kubectl(cluster, "-n", NAMESPACE, "delete", "secret,lease", "holdwarden-certificates",
                "--ignore-not-found")  # fmt: skip
        kubectl(cluster, "delete", "namespace", NAMESPACE, "--timeout=180s", timeout=240)
        admin.close()  # type: ignore[no-untyped-call]


def assert_clean(state: Installed, what: str, start: float, calls_before: dict[str, float],
                 times: str) -> Tally:  # fmt: skip
    """The window from ``start`` to now: writes happened, were judged by the enforcer,
    none wrongly refused, none failed; the line goes to the run's summary."""
    outcomes = state.writer.window(start, time.monotonic())
    counts = tally(outcomes)
    calls = webhook_calls(state.cluster)
    judged = calls["allowed"] - calls_before["allowed"]
    errors = calls["call-errors"] - calls_before["call-errors"]
    report(
        f"disruptions: {what}: {times}; writer: {counts.line()}, {latencies(outcomes)}; "
        f"apiserver: {judged:.0f} calls to the enforcer allowed, {errors:.0f} failed calls"
    )
    assert counts.wrongly_refused == 0 and counts.failed == 0, (
        f"{what}: {counts.line()}\n" + "\n".join(counts.samples[:10])
    )
    assert counts.free_failed == 0, counts.samples[:10]
    assert counts.probes_accepted == 0, f"{what}: a held unsuspend probe was accepted"
    assert counts.held_allowed >= 2 * AFTER_ROUNDS, counts.line()
    assert counts.probes_refused >= AFTER_ROUNDS, counts.line()
    # The held writes were sent to the enforcer and it answered them (not skipped).
    assert judged >= counts.held_allowed, (judged, counts.line())
    assert errors == 0, errors
    assert failure_policies(state.admin) == ["Fail"]
    return counts


def rolled_from(state: Installed, old: set[str]) -> bool:
    deployment: Any = state.apps.read_namespaced_deployment("holdwarden", NAMESPACE)
    status = deployment.status
    return (
        status.observed_generation == deployment.metadata.generation
        and (status.updated_replicas or 0) == 2
        and state.both_ready()
        and not state.pod_names() & old  # the old Pods are gone, not only unready
    )


def test_rollout_restart(installed: Installed) -> None:
    state = installed
    old = state.pod_names()
    calls = webhook_calls(state.cluster)
    start = time.monotonic()
    kubectl(state.cluster, "-n", NAMESPACE, "rollout", "restart", "deployment/holdwarden")
    kubectl(state.cluster, "-n", NAMESPACE, "rollout", "status", "deployment/holdwarden",
            "--timeout=300s", timeout=330)  # fmt: skip
    rollout = time.monotonic() - start
    state.wait("the old Pods deleted after the restart", lambda: rolled_from(state, old), 180)
    gone = time.monotonic() - start
    state.rounds_after()
    assert_clean(state, "kubectl rollout restart", start, calls,
                 f"rollout complete {rollout:.1f}s, old Pods gone {gone:.1f}s")  # fmt: skip
    state.refused_with_audit_line("held-restart")


def test_helm_upgrade_with_a_changed_value(installed: Installed) -> None:
    state = installed
    old = state.pod_names()
    calls = webhook_calls(state.cluster)
    start = time.monotonic()
    changed = "config.webhook.auditLog=/var/log/holdwarden/upgraded.jsonl"
    helm(state.cluster, state.helm_home, "upgrade", "holdwarden", str(CHART), "-n", NAMESPACE,
         *state.values, "--set", changed)  # fmt: skip
    state.wait("the Pods rolled after helm upgrade", lambda: rolled_from(state, old), 300)
    rolled = time.monotonic() - start
    state.rounds_after()
    assert_clean(state, "helm upgrade (config.webhook.auditLog)", start, calls,
                 f"Pods rolled and old ones gone {rolled:.1f}s")  # fmt: skip
    # The new Pods serve the changed configuration (their "serving" line names the file).
    for pod in ready_pods(state.core):
        log = str(state.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE))
        assert "upgraded.jsonl" in log, log[-2000:]
    state.refused_with_audit_line("held-upgrade")


def endpoint_ready(api: k8s.ApiClient) -> dict[str, bool]:
    """Each enforcer Pod the Service's EndpointSlices name: is its endpoint ready?"""
    slices: Any = k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        NAMESPACE, label_selector="kubernetes.io/service-name=holdwarden"
    )
    out: dict[str, bool] = {}
    for piece in slices.items:
        for endpoint in piece.endpoints or []:
            if endpoint.target_ref is not None:
                out[endpoint.target_ref.name] = bool(endpoint.conditions.ready)
    return out


def test_sigkill_of_an_enforcer_container(installed: Installed) -> None:
    state = installed
    cluster = state.cluster
    assert cluster.node is not None
    (victim, *_) = sorted(ready_pods(state.core), key=lambda p: p.metadata.name)
    name = victim.metadata.name
    (status,) = victim.status.container_statuses
    restarts = status.restart_count
    container_id = status.container_id.removeprefix("containerd://")
    # Sample the Service's endpoints meanwhile: the killed Pod must be taken out.
    unready_at: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        with cluster.api_client() as api:
            while not stop.is_set() and not unready_at:
                with contextlib.suppress(ApiException):
                    if endpoint_ready(api).get(name) is False:
                        unready_at.append(time.monotonic())
                stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    calls = webhook_calls(state.cluster)
    start = time.monotonic()
    try:
        subprocess.run(
            ["ctr", f"--address={cluster.node.socket}", "-n", "k8s.io", "tasks", "kill",
             "-s", "SIGKILL", container_id],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip

        def restarted() -> bool:
            pod: Any = state.core.read_namespaced_pod(name, NAMESPACE)
            (now,) = pod.status.container_statuses
            return bool(now.restart_count == restarts + 1 and state.both_ready())

        state.wait(f"{name} restarted by the kubelet and Ready again", restarted, 240)
        back_at = time.monotonic()
        state.wait(
            f"{name}'s endpoint ready again", lambda: endpoint_ready(state.admin).get(name), 60
        )
    finally:
        stop.set()
        sampler.join(10)
    assert unready_at, f"{name}'s endpoint was never seen not ready"
    state.rounds_after()
    outcomes = state.writer.window(start, time.monotonic())
    counts = tally(outcomes)
    after = webhook_calls(cluster)
    judged = after["allowed"] - calls["allowed"]
    errors = after["call-errors"] - calls["call-errors"]
    failures = [o for o in outcomes if o.result == "failed"]
    late = [o for o in failures if o.began > unready_at[0]]
    report(
        f"disruptions: SIGKILL of one enforcer container: its endpoint seen not ready "
        f"{unready_at[0] - start:.1f}s, the container restarted and Ready again "
        f"{back_at - start:.1f}s after the kill; writer: {counts.line()} ({len(late)} of "
        f"the failed begun after the endpoint was seen not ready); apiserver: {judged:.0f} "
        f"calls to the enforcer allowed, {errors:.0f} failed calls"
    )
    # No wrong answer. A SIGKILL cannot drain: the requests on the wire to the killed
    # process fail (connection reset), and so do connections dialed to it before the
    # Service stops routing there (refused); the apiserver does not retry a webhook's
    # POST, and with failurePolicy Fail they fail. Nothing else, and nothing once the
    # Pod is back.
    assert counts.wrongly_refused == 0 and counts.probes_accepted == 0, counts.samples[:10]
    assert counts.free_failed == 0, counts.samples[:10]
    for o in failures:
        assert UNREACHABLE in o.detail, o.detail
        assert (
            "connection reset" in o.detail
            or "connection refused" in o.detail
            or ("EOF" in o.detail)
        ), o.detail
        assert o.began < back_at, (o.began - start, o.detail)
    assert counts.held_allowed >= 2 * AFTER_ROUNDS, counts.line()
    assert judged >= counts.held_allowed, (judged, counts.line())
    assert failure_policies(state.admin) == ["Fail"]
    pod: Any = state.core.read_namespaced_pod(name, NAMESPACE)
    (now,) = pod.status.container_statuses
    assert now.last_state.terminated.exit_code == 137, now.last_state  # 128 + SIGKILL
    state.refused_with_audit_line("held-kill")


def test_node_drain_is_slowed_by_the_disruption_budget(
    installed: Installed, tmp_path: Path
) -> None:
    state = installed
    cluster = state.cluster
    assert cluster.node is not None
    node = cluster.node.name
    core = state.core
    old = state.pod_names()
    # Ready enforcer Pods, sampled throughout the drain.
    fewest_ready = [2]
    stop = threading.Event()

    def sample() -> None:
        with cluster.api_client() as api:
            sampled = k8s.CoreV1Api(api)
            while not stop.is_set():
                with contextlib.suppress(ApiException):
                    fewest_ready[0] = min(fewest_ready[0], len(ready_pods(sampled)))
                stop.wait(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = tmp_path / "drain.log"
    calls = webhook_calls(cluster)
    start = time.monotonic()
    drain: subprocess.Popen[bytes] | None = None
    try:
        with output.open("wb") as sink:
            drain = subprocess.Popen(
                [str(ensure_kubectl(log=False)), "--kubeconfig", str(cluster.kubeconfig_path),
                 "drain", node, f"--pod-selector={SELECTOR}", "--ignore-daemonsets",
                 "--delete-emptydir-data", "--timeout=600s"],
                stdout=sink, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def refusals() -> int:
            return output.read_text().count("violate the pod's disruption budget")

        def pending_replacement() -> bool:
            pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
            return any(
                p.metadata.name not in old
                and any(
                    c.type == "PodScheduled" and c.status == "False"
                    and c.reason == "Unschedulable"
                    for c in p.status.conditions or []
                )
                for p in pods.items
            )  # fmt: skip

        def terminating() -> bool:
            pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
            return any(p.metadata.deletion_timestamp is not None for p in pods.items)

        state.wait("one Pod evicted (terminating)", terminating, 120)
        evicted = time.monotonic() - start
        state.wait("the evicted Pod gone", lambda: len(state.pod_names() & old) == 1, 120)
        gone = time.monotonic() - start
        state.wait("the replacement Pending, unschedulable", pending_replacement, 120)
        # Three refusals: the drain retries every 5 s, so at least 10 s without progress.
        state.wait("the budget refusing the second eviction 3 times",
                   lambda: refusals() >= 3, 180)  # fmt: skip
        assert drain.poll() is None, output.read_text()
        assert len(state.pod_names() & old) == 1, "the second Pod was evicted"
        assert len(ready_pods(core)) == 1
        assert fewest_ready[0] >= 1, "no enforcer Pod Ready during the drain"
        node_now: Any = core.read_node(node)
        assert node_now.spec.unschedulable is True

        # Another node's capacity, here the same node back: the replacement runs, the
        # budget allows the second eviction, and the drain completes.
        held = refusals()
        uncordoned = time.monotonic()
        kubectl(cluster, "uncordon", node)
        rc = drain.wait(timeout=300)
        assert rc == 0, output.read_text()
        drained = time.monotonic() - start
        state.wait("both Pods Ready, neither of the old ones left",
                   lambda: rolled_from(state, old), 300)  # fmt: skip
        recovered = time.monotonic() - uncordoned
    finally:
        stop.set()
        sampler.join(10)
        if drain is not None and drain.poll() is None:
            drain.kill()
            drain.wait(30)
        kubectl(cluster, "uncordon", node)
    assert fewest_ready[0] >= 1, "no enforcer Pod Ready during the drain"
    state.rounds_after()
    text = output.read_text()
    assert_clean(
        state, "kubectl drain of the node", start, calls,
        f"first Pod evicted {evicted:.1f}s, gone {gone:.1f}s after the drain's start; the "
        f"budget refused the second eviction {held} times before the uncordon (at "
        f"{uncordoned - start:.1f}s: the second Pod kept {uncordoned - start - evicted:.1f}s "
        f"with the node cordoned), {text.count('disruption budget') - held} times after; "
        f"drain done "
        f"{drained:.1f}s, both Pods Ready {recovered:.1f}s after the uncordon; fewest Ready "
        f"{fewest_ready[0]}",
    )  # fmt: skip
    state.refused_with_audit_line("held-drain")


def test_scale_to_zero_and_back(installed: Installed) -> None:
    state = installed
    cluster = state.cluster
    custom = state.custom
    calls = webhook_calls(cluster)
    start = time.monotonic()
    try:
        kubectl(cluster, "-n", NAMESPACE, "scale", "deployment/holdwarden", "--replicas=0")

        def down() -> bool:
            return not state.pod_names() and not endpoint_ready(state.admin)

        state.wait("no enforcer Pod left, no endpoint", down, 180)
        down_at = time.monotonic()
        state.rounds_after(5)
        # Not hold-breaking, no hold: sent nowhere, so accepted with no enforcer.
        custom.create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural,
            trainjob_body("created-while-down", suspend=True),
        )  # fmt: skip
        custom.patch_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, f"{FREE}-0",
            {"spec": {"suspend": False}, "metadata": {"labels": {"example.com/down": "yes"}}},
        )  # fmt: skip
        # The hold-breaking write is refused (the webhook cannot be called: Fail).
        try:
            custom.patch_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, "held-scale",
                {"spec": {"suspend": False}}, _request_timeout=30,
            )  # fmt: skip
        except ApiException as exc:
            assert exc.status == 500 and UNREACHABLE in message(exc), exc.body
        else:
            pytest.fail("the held unsuspend was accepted with no enforcer running")
        job: Any = custom.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, "held-scale"
        )
        assert job["spec"]["suspend"] is True
        down_window = state.writer.window(down_at, time.monotonic())
        scaled_up = time.monotonic()
    finally:
        kubectl(cluster, "-n", NAMESPACE, "scale", "deployment/holdwarden", "--replicas=2")
    state.wait("both Pods Ready after the scale-up", state.both_ready, 300)
    ready = time.monotonic() - scaled_up

    def held_write_allowed_since_up() -> bool:
        return any(
            o.target == "held" and o.result == "allowed"
            for o in state.writer.window(scaled_up, time.monotonic())
        )

    state.wait("a held write allowed again", held_write_allowed_since_up, 120)
    state.rounds_after()
    outcomes = state.writer.window(start, time.monotonic())
    counts = tally(outcomes)
    while_down = tally(down_window)
    # While down: writes to objects without a hold all went through; writes to held
    # objects failed (the webhook matches them and could not be called), none accepted.
    assert while_down.free_failed == 0 and while_down.free_allowed >= 5, while_down.line()
    assert while_down.held_allowed == 0 and while_down.failed >= 10, while_down.line()
    assert while_down.probes_accepted == 0, while_down.line()
    assert all(UNREACHABLE in s for s in while_down.samples), while_down.samples[:5]
    # Over the whole phase: none wrongly refused; every failure is "could not call the
    # webhook", and none once held writes were served again.
    assert counts.wrongly_refused == 0 and counts.free_failed == 0, counts.samples[:10]
    assert counts.probes_accepted == 0
    first_served = min(
        o.at for o in outcomes
        if o.at >= scaled_up and o.target == "held"
        and o.result == "allowed"
    )  # fmt: skip
    late = [o for o in outcomes if o.at > first_served and o.result == "failed"]
    assert late == [], [o.detail for o in late[:5]]
    failures = [o for o in outcomes if o.result == "failed"]
    assert all(UNREACHABLE in o.detail for o in failures), [o.detail for o in failures[:5]]
    first_failed = min(o.at for o in failures) - start
    after = webhook_calls(cluster)
    report(
        f"disruptions: scale to 0 and back: no Pod left {down_at - start:.1f}s after the "
        f"scale-down, both Ready {ready:.1f}s after the scale-up; while down: "
        f"{while_down.line()}; whole phase: {counts.line()} (first failure "
        f"{first_failed:.1f}s after the scale-down, served again "
        f"{first_served - scaled_up:.1f}s after the scale-up); apiserver: "
        f"{after['call-errors'] - calls['call-errors']:.0f} failed calls to the enforcer"
    )
    assert failure_policies(state.admin) == ["Fail"]
    state.refused_with_audit_line("held-scale")
