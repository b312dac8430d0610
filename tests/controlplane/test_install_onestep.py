"""The one-step install on the real kube-apiserver, from an empty cluster, and its uninstall.

Each test starts a control plane of its own (real etcd and kube-apiserver, the upstream
Kueue and Trainer CRDs, nothing of holdwarden), renders the shipped install with the real
tool (kustomize v5.5.0 for ``manifests/``, Helm v3.21.4 for ``charts/holdwarden`` with the
Namespace made as docs/install.md says) and creates every object as rendered. There is no
kubelet, so the enforcer process stands in for the Deployment's Pod: ``holdwarden serve``
with the Deployment's own arguments, the rendered ConfigMap's configuration, and the Pod's
service account, authenticated by a real TokenRequest token (its RBAC is the rendered one).
Two things are changed for that, and nothing else: the webhook's ``clientConfig`` is a URL
to the process (a Service without Pods has no endpoints, and the apiserver would dial its
cluster IP) and the configuration's addresses are local ones (listen, metrics, audit file,
and ``127.0.0.1`` among the certificate's names so that the URL verifies).

Throughout, a writer keeps updating a held TrainJob and a held Workload (writes the webhook
is sent, which a webhook at ``failurePolicy: Fail`` without a trusted enforcer would refuse)
and every one of its writes must succeed; a prober sends the held-unsuspend the enforcer
must refuse (a dry-run update). The test prints apply -> first refusal, apply -> Fail, the
correction of a reset failurePolicy, and the uninstall's time; after the uninstall no
webhook configuration or policy is left and the hold-breaking write goes through.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.config import CertificatesConfig
from holdwarden.kubeclient import api_client
from holdwarden.vocabulary import FAILURE_POLICY_ANNOTATION, TRAINJOB, WORKLOAD, Annotations
from rig.builders import trainjob_body, workload_body
from rig.localcluster import LocalCluster
from rig.localcluster.ports import free_port
from tests.controlplane.test_chart import helm_template
from tests.controlplane.test_manifests_render import _call, _collection
from tests.support.kustomize import generated_as, render
from tests.support.tool_binaries import ensure_helm

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NAMESPACE = "holdwarden-system"
TEAM = "team-a"
WEBHOOK = "holdwarden-enforcer"
A = Annotations()
PROBE_NAMESPACE = CertificatesConfig().probe_namespace
HOLD = {
    A.hold_instance: "1",
    A.hold_reason: "one-step install test",
    A.held_at: "2026-12-01T00:00:00Z",
    A.held_by: "holdwarden",
}


def wait_for(what: str, check: Callable[[], bool], seconds: float, every: float = 0.2) -> float:
    """Poll ``check`` until true (bounded); the seconds it took."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if check():
            return time.monotonic() - began
        time.sleep(every)
    raise AssertionError(f"{what}: not within {seconds:.0f} s")


@pytest.fixture
def empty_cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    local.start()
    try:
        yield local
    finally:
        local.stop()


def rendered(source: str, tmp: Path) -> list[dict[str, Any]]:
    """The shipped install's objects, as the real tool renders them."""
    if source == "kustomize":
        return render(MANIFESTS)
    # docs/install.md, Helm: the Namespace with its Pod Security labels first, then the chart.
    namespace = yaml.safe_load((MANIFESTS / "namespace.yaml").read_text())
    return [namespace, *helm_template(ensure_helm(log=False), [], tmp)]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and generated_as(o, name)]
    return found


@dataclass
class Writer:
    """Keeps writing held objects the webhook is sent (each write must succeed) and
    probing with the held-unsuspend the enforcer must refuse (dry run)."""

    api: k8s.ApiClient
    started: float
    writes: int = 0
    wrong: list[str] = field(default_factory=list)
    refusals: list[float] = field(default_factory=list)
    accepted_probes: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        custom = k8s.CustomObjectsApi(self.api)
        n = 0
        while not self.stop.is_set():
            n += 1
            for coords, name in ((TRAINJOB, "held-job"), (WORKLOAD, "held-workload")):
                patch = {"metadata": {"annotations": {A.hold_reason: f"write {n}"}}}
                try:
                    custom.patch_namespaced_custom_object(
                        coords.group, coords.version, TEAM, coords.plural, name, patch,
                        _request_timeout=30,
                    )  # fmt: skip
                    self.writes += 1
                except ApiException as exc:
                    at = time.monotonic() - self.started
                    self.wrong.append(f"{at:.1f}s {coords.kind} {exc.status}: {exc.body}"[:400])
            self.probe(custom)
            self.stop.wait(0.1)

    def probe(self, custom: k8s.CustomObjectsApi) -> None:
        patch = {"spec": {"suspend": False}}
        try:
            custom.patch_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, "held-job", patch,
                dry_run="All", _request_timeout=30,
            )  # fmt: skip
            self.accepted_probes += 1
        except ApiException as exc:
            text = exc.body or ""
            if exc.status == 403 and "held-trainjob-suspended" in text:
                self.refusals.append(time.monotonic() - self.started)
            else:
                at = time.monotonic() - self.started
                self.wrong.append(f"{at:.1f}s probe {exc.status}: {text}"[:400])


def token_kubeconfig(cluster: LocalCluster, api: k8s.ApiClient, path: Path) -> Path:
    """A kubeconfig for the Pod's service account, with a real TokenRequest token."""
    status = (
        k8s.CoreV1Api(api)
        .create_namespaced_service_account_token(
            "holdwarden",
            NAMESPACE,
            k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[])),
        )
        .status
    )
    assert status is not None and status.token
    return cluster.user_kubeconfig(path, "holdwarden", {"token": str(status.token)})


def assert_the_probe_role_creates_dry_runs_only(
    kubeconfig: Path, admin: k8s.CustomObjectsApi
) -> None:
    """The enforcer's account may create a TrainJob in the probe namespace as a server-side
    dry run (its verification probe), and is refused a real one by the policy
    holdwarden-enforcer-probe-dry-run-only: a TrainJob runs pods."""
    as_enforcer = k8s.CustomObjectsApi(api_client(str(kubeconfig)))
    body = trainjob_body("not-a-probe", suspend=True)
    args = (TRAINJOB.group, TRAINJOB.version, PROBE_NAMESPACE, TRAINJOB.plural, body)
    as_enforcer.create_namespaced_custom_object(*args, dry_run="All", _request_timeout=30)
    with pytest.raises(ApiException) as refused:
        as_enforcer.create_namespaced_custom_object(*args, _request_timeout=30)
    assert refused.value.status == 403, refused.value.body
    assert "holdwarden-enforcer-probe-dry-run-only" in str(refused.value.body)
    left: Any = admin.list_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, PROBE_NAMESPACE, TRAINJOB.plural
    )
    assert left["items"] == []


def create(cluster: LocalCluster, api: k8s.ApiClient, obj: dict[str, Any], cache: Any) -> None:
    path = _collection(cluster, api, obj, cache)
    status, body, _ = _call(cluster, api, "POST", path, obj)
    assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"


def delete(cluster: LocalCluster, api: k8s.ApiClient, obj: dict[str, Any], cache: Any) -> None:
    path = f"{_collection(cluster, api, obj, cache)}/{obj['metadata']['name']}"
    status, body, _ = _call(cluster, api, "DELETE", path)
    assert status in (200, 202, 404), f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"


def failure_policies(api: k8s.ApiClient) -> list[str]:
    try:
        config: Any = k8s.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
            WEBHOOK, _request_timeout=30
        )
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
    return [w.failure_policy for w in config.webhooks]


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_one_step_install_enforces_without_refusing_a_write_and_uninstalls_clean(
    empty_cluster: LocalCluster, tmp_path: Path, source: str
) -> None:
    cluster = empty_cluster
    objs = rendered(source, tmp_path)
    admin = cluster.api_client()
    core = k8s.CoreV1Api(admin)
    custom = k8s.CustomObjectsApi(admin)
    # Nothing of holdwarden's in the cluster yet.
    hooks: Any = k8s.AdmissionregistrationV1Api(admin).list_validating_webhook_configuration()
    assert hooks.items == []
    # A user's namespace with a held TrainJob and a held Workload.
    cluster.create_namespace(TEAM)
    job = trainjob_body("held-job", suspend=True)
    job["metadata"]["annotations"] = dict(HOLD)
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, TEAM, TRAINJOB.plural, job
    )
    workload = workload_body("held-workload", active=False)
    workload["metadata"]["annotations"] = dict(HOLD)
    custom.create_namespaced_custom_object(
        WORKLOAD.group, WORKLOAD.version, TEAM, WORKLOAD.plural, workload
    )

    # The stand-in's routing and local addresses (the module docstring says why).
    port, metrics_port = free_port(), free_port()
    hook = find(objs, "ValidatingWebhookConfiguration", WEBHOOK)
    assert hook["webhooks"][0]["failurePolicy"] == "Ignore"
    assert hook["metadata"]["annotations"][FAILURE_POLICY_ANNOTATION] == "Fail"
    for entry in hook["webhooks"]:
        entry["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate"}
    configmap = find(objs, "ConfigMap", "holdwarden-config")
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    config["webhook"].update(
        listenAddress=f"127.0.0.1:{port}",
        metricsAddress=f"127.0.0.1:{metrics_port}",
        auditLog=str(tmp_path / "audit.jsonl"),
    )
    config["webhook"].setdefault("certificates", {})["ipAddresses"] = ["127.0.0.1"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    deployment = find(objs, "Deployment", "holdwarden")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    args = list(container["args"])
    args[args.index("--config") + 1] = str(config_file)

    writer = Writer(cluster.api_client(), started=time.monotonic())
    cache: dict[str, Any] = {}
    server: subprocess.Popen[bytes] | None = None
    log = tmp_path / "serve.log"
    thread = threading.Thread(target=writer.run, name="writer", daemon=True)
    thread.start()
    installed: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)  # the writer's first writes land before the install
        applied_at = time.monotonic()
        for obj in objs:
            create(cluster, admin, obj, cache)
            installed.append(obj)
        apply_seconds = time.monotonic() - applied_at
        # The Pod starts: its service account's token, the Deployment's arguments.
        kubeconfig = token_kubeconfig(cluster, admin, tmp_path / "holdwarden.kubeconfig")
        with log.open("wb") as sink:
            server = subprocess.Popen(
                [sys.executable, "-m", "holdwarden.cli", *args],
                env={**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE},
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

        def alive() -> None:
            assert server is not None and server.poll() is None, log.read_text()[-3000:]

        def refused() -> bool:
            alive()
            return bool(writer.refusals)

        wait_for("the first refused held-unsuspend", refused, 120)
        first_refusal = writer.refusals[0] - (applied_at - writer.started)

        def enforcing() -> bool:
            alive()
            return failure_policies(admin) == ["Fail"]

        wait_for("failurePolicy Fail", enforcing, 120)
        fail_at = time.monotonic() - applied_at
        text = log.read_text()
        assert "failurePolicy set to Fail" in text, text[-3000:]

        # A re-apply that resets the field (server-side apply with --force-conflicts would):
        # corrected within a few intervals, and no write refused meanwhile.
        admission = k8s.AdmissionregistrationV1Api(admin)
        live: Any = admission.read_validating_webhook_configuration(WEBHOOK)
        for entry in live.webhooks:
            entry.failure_policy = "Ignore"
        admission.replace_validating_webhook_configuration(WEBHOOK, live)
        reset_seconds = wait_for("failurePolicy Fail again", enforcing, 120)
        assert_the_probe_role_creates_dry_runs_only(kubeconfig, custom)

        # The helm test hook's command (holdwarden.webhook.selftest) against this enforcer, with the
        # CA the webhook trusts (the Secret's ca.crt, what the hook's Pod mounts).
        secret: Any = core.read_namespaced_secret("holdwarden-certificates", NAMESPACE)
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(base64.b64decode(secret.data["ca.crt"]))
        selftest = subprocess.run(
            [sys.executable, "-m", "holdwarden.webhook.selftest", "--url",
             f"https://127.0.0.1:{port}/validate", "--ca-file", str(ca_file),
             "--config", str(config_file)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert selftest.returncode == 0, selftest.stdout + selftest.stderr
        assert "ok: refused by held-trainjob-suspended" in selftest.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=10) as r:
            assert r.status == 200
        time.sleep(2.0)  # more writes at Fail

        # Uninstall as docs/install.md says: the webhook configuration (and any policy)
        # first, then everything else; the Pod goes with its Deployment.
        uninstall_at = time.monotonic()
        first = [o for o in installed if o["kind"].startswith("Validating")]
        rest = [o for o in reversed(installed) if o not in first]
        for obj in first:
            delete(cluster, admin, obj, cache)
        unguarded = time.monotonic() - uninstall_at
        for obj in rest:
            delete(cluster, admin, obj, cache)
            if obj["kind"] == "Deployment":
                server.terminate()
                server.wait(timeout=60)
        uninstall_seconds = time.monotonic() - uninstall_at
        installed.clear()
        time.sleep(2.0)  # the writer goes on after the uninstall
    finally:
        writer.stop.set()
        thread.join(timeout=60)
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(timeout=60)
        for obj in [o for o in installed if o["kind"].startswith("Validating")]:
            delete(cluster, admin, obj, cache)
    # Afterwards: no webhook configuration and no policy that could refuse a write.
    registrations = k8s.AdmissionregistrationV1Api(admin)
    left: Any = registrations.list_validating_webhook_configuration()
    assert left.items == []
    policies: Any = registrations.list_validating_admission_policy()
    assert policies.items == []
    bindings: Any = registrations.list_validating_admission_policy_binding()
    assert bindings.items == []
    accepted_before = writer.accepted_probes
    writer.probe(custom)
    assert writer.accepted_probes == accepted_before + 1, writer.wrong[-3:]
    assert writer.wrong == [], writer.wrong[:5]
    assert writer.writes >= 40, writer.writes
    print(
        f"\none-step install ({source}): {len(objs)} objects applied in {apply_seconds:.1f}s; "
        f"apply -> first refused held-unsuspend {first_refusal:.1f}s; "
        f"apply -> failurePolicy Fail {fail_at:.1f}s; reset to Ignore -> Fail again "
        f"{reset_seconds:.1f}s; uninstall {uninstall_seconds:.1f}s (webhook configuration "
        f"gone after {unguarded:.2f}s); {writer.writes} writes of held objects, 0 refused; "
        f"{len(writer.refusals)} held-unsuspends refused"
    )
    admin.close()  # type: ignore[no-untyped-call]
    writer.api.close()  # type: ignore[no-untyped-call]
