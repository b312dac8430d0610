"""The Events audit sink end to end: the real kube-apiserver calls the enforcer over TLS,
the enforcer refuses, and its Events sink writes ``events.k8s.io/v1`` Events to the same
apiserver as the enforcer's service account, bound to the shipped role
``holdwarden-audit-events`` and nothing else (its rules read from manifests/rbac.yaml).

Proven here: a refused write becomes an Event regarding that object with the rule as its
reason; identical refusals become one Event whose ``series.count`` is their number; a
dry-run refusal is no Event; ``holdwarden audit --from-cluster`` prints them; and an Events
API that never answers, or refuses (no RBAC), neither delays nor changes an admission
answer.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.certs.generate import generate_ca, generate_serving
from holdwarden.certs.reload import ReloadingTLS
from holdwarden.cli.enforcer import EnforcerServer
from holdwarden.config import AuditEventsConfig, Config, WebhookConfig
from holdwarden.vocabulary import TRAINJOB, event_reason
from holdwarden.webhook.audit_sinks import EVENT_WRITE_ATTEMPTS, EventLabels, EventsSink, KubeEvents
from rig.localcluster import EDITOR_USER, UNPRIVILEGED_USER, LocalCluster
from rig.localcluster.realstory import wait_until_enforced
from tests.controlplane.test_webhook_e2e import (
    MERGE,
    WEBHOOK_NAME,
    held_trainjob,
    patch,
    refused,
)
from tests.support.enforcer_tls import run_in_thread
from tests.support.kustomize import render
from tests.support.rbac_helpers import wait_allowed
from tests.support.shipped_webhook import (
    local_registration,
    local_webhook,
)

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
LABEL = "holdwarden.io/audit-events-e2e"
ACCOUNT = "system:serviceaccount:holdwarden-system:holdwarden"
RULE = "held-trainjob-suspended"
LABELS = EventLabels("holdwarden.io")
WAIT = 30.0


@dataclass
class Hooked:
    server: EnforcerServer
    token: str
    cluster: LocalCluster

    @property
    def sink(self) -> EventsSink:
        assert self.server.events_sink is not None
        return self.server.events_sink

    def namespace(self) -> str:
        return self.cluster.create_namespace(
            f"ev-{uuid.uuid4().hex[:10]}", labels={LABEL: self.token}
        )


@contextlib.contextmanager
def hooked_enforcer(
    cluster: LocalCluster, work: Path, events: KubeEvents, **settings: Any
) -> Iterator[Hooked]:
    """An enforcer with the file and Events sinks, registered in the apiserver for the
    namespaces carrying this module's label with a value of its own."""
    work.mkdir(parents=True, exist_ok=True)
    ca = generate_ca()
    leaf = generate_serving(ca, "holdwarden", "holdwarden-system", ip_addresses=["127.0.0.1"])
    (work / "tls.crt").write_bytes(leaf.cert_pem)
    (work / "tls.key").write_bytes(leaf.key_pem)
    config = Config(
        webhook=WebhookConfig(
            listen_address="127.0.0.1:0",
            metrics_address="127.0.0.1:0",
            cert_dir=work,
            audit_log=work / "audit.jsonl",
            audit_sinks=("file", "events"),
            audit_events=AuditEventsConfig(**{"qps": 50.0, "burst": 50, **settings}),
        )
    )
    tls = ReloadingTLS(work / "tls.crt", work / "tls.key")
    server, stop = _serve_in_thread_with(config, tls, events)
    token = uuid.uuid4().hex[:12]
    name = f"holdwarden-events-e2e-{token}"
    body: Any = local_registration(
        name, local_webhook(server.port, {LABEL: token}, ca_pem=ca.cert_pem, name=WEBHOOK_NAME)
    )
    with cluster.api_client() as admin:
        registrations = k8s.AdmissionregistrationV1Api(admin)
        registrations.create_validating_webhook_configuration(body)
        try:
            hooked = Hooked(server, token, cluster)
            wait_until_enforced(admin, hooked.namespace())
            yield hooked
        finally:
            registrations.delete_validating_webhook_configuration(name)
            stop()
            events.close()


def _serve_in_thread_with(
    config: Config, tls: ReloadingTLS, events: KubeEvents
) -> tuple[EnforcerServer, Callable[[], None]]:
    """The enforcer on its own thread and event loop, with the Events client given; and
    how to stop it."""
    server = EnforcerServer(config, tls=tls, events_client=events)
    return server, run_in_thread(server)


@pytest.fixture(scope="module")
def events_role(cluster: LocalCluster) -> Iterator[None]:
    """The shipped Events role (rules from manifests/rbac.yaml), under a name of this
    module's, bound to the enforcer's service account; removed afterwards."""
    (shipped,) = [
        o
        for o in render(ROOT / "manifests")
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "holdwarden-audit-events"
    ]
    name = f"holdwarden-audit-events-e2e-{uuid.uuid4().hex[:6]}"
    role: Any = {**shipped, "metadata": {"name": name}}
    binding: Any = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": "holdwarden", "namespace": "holdwarden-system"}
        ],
    }
    with cluster.api_client() as admin:
        authz = k8s.RbacAuthorizationV1Api(admin)
        authz.create_cluster_role(role)
        authz.create_cluster_role_binding(binding)
        try:
            with cluster.api_client(ACCOUNT) as account:
                wait_allowed(account, "create", "events.events.k8s.io", "default")
            yield
        finally:
            authz.delete_cluster_role_binding(name)
            authz.delete_cluster_role(name)


@pytest.fixture(scope="module")
def enforcer(
    cluster: LocalCluster, events_role: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hooked]:
    events = KubeEvents(cluster.api_client(ACCOUNT), timeout=5.0)
    with hooked_enforcer(cluster, tmp_path_factory.mktemp("events"), events) as hooked:
        yield hooked


def our_events(admin: k8s.ApiClient, namespace: str) -> list[dict[str, Any]]:
    response: Any = k8s.EventsV1Api(admin).list_namespaced_event(
        namespace,
        label_selector=f"{LABELS.audit}=refusal",
        _preload_content=False,
        _request_timeout=10,
    )
    try:
        items: list[dict[str, Any]] = json.loads(response.data)["items"]
    finally:
        response.release_conn()
    return items


def wait_for(
    read: Callable[[], list[dict[str, Any]]], done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT
    while True:
        got = read()
        if done(got):
            return got
        assert time.monotonic() < deadline, f"timed out; last read: {json.dumps(got)[:2000]}"
        time.sleep(0.1)


def unsuspend(api: k8s.ApiClient, obj: dict[str, Any], *, dry_run: bool = False) -> str:
    meta = obj["metadata"]
    return refused(
        lambda: patch(
            api,
            TRAINJOB.kind,
            meta["namespace"],
            meta["name"],
            {"spec": {"suspend": False}},
            MERGE,
            dry_run=dry_run,
        ),
        RULE,
    )


def test_a_refused_write_becomes_an_event_regarding_the_object(
    enforcer: Hooked, admin_client: k8s.ApiClient, editor_client: k8s.ApiClient
) -> None:
    namespace = enforcer.namespace()
    job = held_trainjob(admin_client, namespace, instance="3")
    message = unsuspend(editor_client, job)
    (event,) = wait_for(lambda: our_events(admin_client, namespace), lambda got: len(got) == 1)
    name = job["metadata"]["name"]
    assert event["regarding"] == {
        "apiVersion": f"{TRAINJOB.group}/{TRAINJOB.version}",
        "kind": TRAINJOB.kind,
        "namespace": namespace,
        "name": name,
    }
    assert event["reason"] == event_reason(RULE) and event["type"] == "Warning"
    assert event["action"] == "RefuseUpdate"
    assert event["reportingController"] == "holdwarden.io/enforcer"
    assert event["reportingInstance"] == enforcer.sink.instance
    assert event["metadata"]["name"].startswith(f"{name}.")
    # The note is the refusal's own message (the apiserver's adds its prefix).
    assert event["note"] and event["note"] in message and f"[{RULE}]" in event["note"]
    annotations = event["metadata"]["annotations"]
    assert annotations[LABELS.user] == EDITOR_USER
    assert annotations[LABELS.operation] == "UPDATE"
    assert annotations[LABELS.instance] == "3"
    assert "series" not in event or event["series"] is None


def test_identical_refusals_fold_into_one_event_and_audit_from_cluster_prints_it(
    enforcer: Hooked,
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
    tmp_path: Path,
) -> None:
    namespace = enforcer.namespace()
    job = held_trainjob(admin_client, namespace, instance="4")
    refusals = 6
    for _ in range(refusals):
        unsuspend(editor_client, job)
    (event,) = wait_for(
        lambda: our_events(admin_client, namespace),
        lambda got: len(got) == 1 and ((got[0].get("series") or {}).get("count") == refusals),
    )
    assert event["series"]["lastObservedTime"] >= event["eventTime"]
    # A dry-run refusal of the same write is no Event: the series stays at 6.
    dry_before = enforcer.sink.counts.dry_run
    unsuspend(editor_client, job, dry_run=True)
    assert enforcer.sink.counts.dry_run == dry_before + 1
    (again,) = our_events(admin_client, namespace)
    assert again["series"]["count"] == refusals

    # holdwarden audit --from-cluster, as an operator runs it.
    command = [sys.executable, "-m", "holdwarden.cli", "audit", "--from-cluster",
               "--kubeconfig", str(cluster.kubeconfig_path), "-n", namespace]  # fmt: skip
    table = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "TIME", "COUNT", "RULE", "NAMESPACE", "NAME", "INSTANCE", "USER", "OPERATION",
    ]  # fmt: skip
    (row,) = rows
    assert row.split()[1:] == [
        str(refusals), RULE, namespace, job["metadata"]["name"], "4", EDITOR_USER, "UPDATE",
    ]  # fmt: skip
    as_json = subprocess.run(
        [*command, "-o", "json", "--rule", RULE, "--user", EDITOR_USER],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    (record,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert record["count"] == refusals and record["name"] == job["metadata"]["name"]
    other_user = subprocess.run(
        [*command, "--user", "nobody"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert other_user.returncode == 0 and len(other_user.stdout.splitlines()) == 1  # header


@contextlib.contextmanager
def blackhole() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (an apiserver that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


def _timed_refusals(
    hooked: Hooked, admin: k8s.ApiClient, editor: k8s.ApiClient, count: int
) -> list[float]:
    """``count`` refusals of distinct objects (so each is an Events API call): seconds
    each took, and each refused as usual."""
    namespace = hooked.namespace()
    seconds: list[float] = []
    for _ in range(count):
        job = held_trainjob(admin, namespace)
        started = time.monotonic()
        message = unsuspend(editor, job)
        seconds.append(time.monotonic() - started)
        assert job["metadata"]["name"] in message
    return seconds


@pytest.mark.parametrize("failure", ["hangs", "refuses"])
def test_an_events_api_that_hangs_or_refuses_never_delays_or_changes_an_answer(
    failure: str,
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    editor_client: k8s.ApiClient,
    tmp_path: Path,
) -> None:
    with contextlib.ExitStack() as stack:
        if failure == "hangs":
            port = stack.enter_context(blackhole())
            configuration = cluster.configuration()
            configuration.host = f"https://127.0.0.1:{port}"
            api = k8s.ApiClient(configuration)
        else:  # mallory: no right to write Events
            api = cluster.api_client(UNPRIVILEGED_USER)
        timeout = 3.0
        events = KubeEvents(api, timeout=timeout)
        hooked = stack.enter_context(hooked_enforcer(cluster, tmp_path / failure, events))
        seconds = _timed_refusals(hooked, admin_client, editor_client, 4)
        # Each answer came well before one Events call could time out: none waited on it.
        assert max(seconds) < timeout, seconds
        sink = hooked.sink
        # One worker: a hanging API costs each of the 4 keys every attempt's timeout.
        deadline = time.monotonic() + WAIT + 4 * EVENT_WRITE_ATTEMPTS * timeout
        while sink.counts.failed < 4:
            assert time.monotonic() < deadline, sink.counts
            time.sleep(0.1)
        assert sink.counts.created == 0
        assert set(sink.counts.by_error) == {"unreachable" if failure == "hangs" else "403"}
        # No answer may pass: retried; a refusal (403) will not: never retried.
        retries = 4 * (EVENT_WRITE_ATTEMPTS - 1) if failure == "hangs" else 0
        assert sink.counts.retried == retries, sink.counts
        api.close()  # type: ignore[no-untyped-call]
