"""``kubectl apply -k`` of the shipped base on the real node, as docs/install.md says users
install it: an overlay that lists ``manifests/`` and names the image (``make image``'s
archive, imported into the node's containerd), nothing else changed.

Then, with real Pods: both replicas Ready under the namespace's Pod Security ``restricted``
(enforce) as uid 65532 on a read-only root; the webhook's failurePolicy turns ``Fail`` (the
time from the apply is printed); the apiserver calls the enforcer through the Service and
refuses a held TrainJob's unsuspend by holdwarden's rule, and the refusal's audit line is
in a Pod's stdout; no Pod is reported failing its readiness probe while starting (the
startup probe); a changed configuration re-applied from the overlay rolls the Pods, which
serve it; the uninstall of docs/install.md (the webhook configuration first, then
``kubectl delete -k``) leaves nothing that refuses the same write.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.vocabulary import TRAINJOB, Annotations
from rig import image as image_build
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster
from tests.pods.conftest import report
from tests.support.tool_binaries import ensure_kubectl

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent.parent
MANIFESTS = ROOT / "manifests"
NAMESPACE = "holdwarden-system"
WEBHOOK = "holdwarden-enforcer"
SELECTOR = "app.kubernetes.io/name=holdwarden,app.kubernetes.io/component=enforcer"
A = Annotations()
HOLD = {
    A.hold_instance: "1",
    A.hold_reason: "real node install test",
    A.held_at: "2026-12-01T00:00:00Z",
    A.held_by: "holdwarden",
}


def kubectl(cluster: LocalCluster, *args: str, timeout: float = 180) -> str:
    """Run kubectl v1.36.3 against the cluster; its stdout, or the test fails with its output."""
    command = [str(ensure_kubectl(log=False)), "--kubeconfig", str(cluster.kubeconfig_path)]
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return result.stdout


def diagnostics(cluster: LocalCluster) -> str:
    """The enforcer Pods' logs and the namespace's Events, for a failure's message."""
    out: list[str] = []
    with cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        try:
            pods: Any = core.list_namespaced_pod(NAMESPACE)
            for pod in pods.items:
                name = pod.metadata.name
                out.append(f"--- Pod {name}: {pod.status.phase} {pod.status.conditions}")
                try:
                    log = core.read_namespaced_pod_log(name, NAMESPACE, tail_lines=40)
                    out.append(str(log))
                except ApiException as exc:
                    out.append(f"(no log: {exc.status})")
            events: Any = core.list_namespaced_event(NAMESPACE)
            out.append("--- Events")
            out.extend(
                f"{e.type} {e.reason} {e.involved_object.kind}/{e.involved_object.name}: "
                f"{e.message}"
                for e in events.items
            )
        except ApiException as exc:
            out.append(f"(diagnostics: {exc.status})")
    tails = cluster.node.log_tails() if cluster.node is not None else ""
    return "\n".join(out)[-8000:] + "\n" + tails[-3000:]


def wait_for(cluster: LocalCluster, what: str, check: Callable[[], Any], seconds: float) -> Any:
    """Poll ``check`` until truthy (bounded); on timeout fail with the Pods' logs and Events."""
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds:.0f}s\n{diagnostics(cluster)}")
        time.sleep(0.5)


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


def ready_pods(core: k8s.CoreV1Api) -> list[Any]:
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
    return [
        p
        for p in pods.items
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def write_overlay(folder: Path, image: str, tag: str, config: str | None = None) -> Path:
    """docs/install.md's overlay: the base and the image's name (and, given ``config``, a
    patch of the configuration)."""
    folder.mkdir(parents=True, exist_ok=True)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS, folder)],
        "images": [{"name": "holdwarden", "newName": image, "newTag": tag}],
    }
    if config is not None:
        patch = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "holdwarden-config", "namespace": NAMESPACE},
            "data": {"config.yaml": config},
        }
        (folder / "configmap.yaml").write_text(yaml.safe_dump(patch))
        kustomization["patches"] = [{"path": "configmap.yaml"}]
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return folder


def unsuspend(custom: k8s.CustomObjectsApi, namespace: str) -> ApiException | None:
    """The held TrainJob's unsuspend, a real write: None if accepted, else the refusal."""
    try:
        custom.patch_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, "held-job",
            {"spec": {"suspend": False}}, _request_timeout=30,
        )  # fmt: skip
    except ApiException as exc:
        return exc
    return None


def base_config(overlay: Path) -> str:
    """The shipped configuration, as the overlay renders it."""
    rendered = yaml.safe_load_all(kubectl_kustomize(overlay))
    (configmap,) = [o for o in rendered if o and o["kind"] == "ConfigMap"]
    return str(configmap["data"]["config.yaml"])


def kubectl_kustomize(overlay: Path) -> str:
    result = subprocess.run(
        [str(ensure_kubectl(log=False)), "kustomize", str(overlay)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_no_failed_probes(core: k8s.CoreV1Api, terminated: frozenset[str] = frozenset()) -> None:
    """No enforcer Pod has been reported failing its readiness or liveness probe, but for
    the readiness of the ``terminated`` Pods: the kubelet probes readiness until the
    container exits, and a draining enforcer fails it by design ("shutting down", then
    the closed port) so that endpoints move away. Their liveness still counts."""
    events: Any = core.list_namespaced_event(NAMESPACE)
    failed = [
        f"{e.involved_object.name}: {e.message}"
        for e in events.items
        if e.reason == "Unhealthy"
        and ("Liveness" in e.message
             or ("Readiness" in e.message and e.involved_object.name not in terminated))
    ]  # fmt: skip
    assert failed == [], failed


def in_pod(cluster: LocalCluster, pod: str, *command: str) -> str:
    return kubectl(cluster, "-n", NAMESPACE, "exec", pod, "-c", "enforcer", "--", *command)


def test_kubectl_apply_k_runs_the_enforcer_on_the_real_node(
    pods_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = pods_cluster
    # Cached: tests/controlplane/test_image.py builds it too.
    built = image_build.build_image(quiet=True)
    names = cluster.import_image(built.archive)
    image = "docker.io/library/holdwarden"
    assert f"{image}:{built.version}" in names, names
    overlay = write_overlay(tmp_path / "overlays" / "prod", image, built.version)
    admin = cluster.api_client()
    core = k8s.CoreV1Api(admin)
    apps = k8s.AppsV1Api(admin)
    custom = k8s.CustomObjectsApi(admin)
    team = cluster.create_namespace("team-install")
    job = trainjob_body("held-job", suspend=True)
    job["metadata"]["annotations"] = dict(HOLD)
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, team, TRAINJOB.plural, job
    )
    installed = False
    try:
        applied_at = time.monotonic()
        kubectl(cluster, "apply", "-k", str(overlay))
        installed = True
        namespace: Any = core.read_namespace(NAMESPACE)
        assert namespace.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"

        def both_ready() -> bool:
            deployment: Any = apps.read_namespaced_deployment("holdwarden", NAMESPACE)
            return (deployment.status.ready_replicas or 0) == 2 and len(ready_pods(core)) == 2

        wait_for(cluster, "both enforcer replicas Ready", both_ready, 240)
        ready_at = time.monotonic() - applied_at
        # The startup probe covers the start: no Pod is reported failing readiness.
        assert_no_failed_probes(core)
        pods = ready_pods(core)
        for pod in pods:
            (container,) = pod.spec.containers
            assert container.image == f"{image}:{built.version}"
            assert container.security_context.read_only_root_filesystem is True
            name = pod.metadata.name
            # The running process, not only the spec: its uid and gid, and a root it
            # cannot write.
            ids = in_pod(
                cluster, name, "python3", "-c", "import os; print(os.getuid(), os.getgid())"
            )
            assert ids.split() == ["65532", "65532"], ids
            probe = in_pod(
                cluster, name, "python3", "-c",
                "import os\ntry:\n    open('/probe', 'w')\nexcept OSError as e:\n"
                "    print(e.errno)\nelse:\n    print('written')",
            )  # fmt: skip
            assert probe.strip() == "30", f"the root is writable in {name}: {probe}"  # EROFS

        wait_for(cluster, "failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 180)
        fail_at = time.monotonic() - applied_at

        # The apiserver sends the held unsuspend through the Service to a Pod, which refuses
        # it by holdwarden's rule.
        refusal = unsuspend(custom, team)
        assert refusal is not None, "the held TrainJob's unsuspend was accepted"
        body = str(refusal.body)
        assert refusal.status == 403, body
        message = str(json.loads(body)["message"])
        assert message.startswith('admission webhook "enforcer.holdwarden.io" denied'), body
        assert "[held-trainjob-suspended]" in message, body

        def audit_line() -> dict[str, Any] | None:
            for pod in ready_pods(core):
                log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
                for line in str(log).splitlines():
                    if not line.startswith("{"):
                        continue
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if entry.get("audit") is True and "held-job" in line and team in line:
                        return dict(entry)
            return None

        entry = wait_for(cluster, "the refusal's audit line in a Pod's stdout", audit_line, 30)
        assert "held-trainjob-suspended" in json.dumps(entry), entry

        # A changed configuration, re-applied from the overlay, rolls the Pods, and the new
        # ones serve it (their "serving" line names the new audit file).
        old_pods = {p.metadata.name for p in ready_pods(core)}
        config = base_config(overlay).replace(
            "auditLog: /var/log/holdwarden/audit.jsonl",
            "auditLog: /var/log/holdwarden/audit-changed.jsonl",
        )
        write_overlay(overlay, image, built.version, config=config)
        rolled_at = time.monotonic()
        kubectl(cluster, "apply", "-k", str(overlay))

        def rolled() -> bool:
            deployment: Any = apps.read_namespaced_deployment("holdwarden", NAMESPACE)
            status = deployment.status
            pods = ready_pods(core)
            return (
                status.observed_generation == deployment.metadata.generation
                and (status.updated_replicas or 0) == 2
                and (status.replicas or 0) == 2
                and len(pods) == 2
                and not {p.metadata.name for p in pods} & old_pods
            )

        wait_for(cluster, "the Pods rolled after a configuration change", rolled, 300)
        rollout_seconds = time.monotonic() - rolled_at
        for pod in ready_pods(core):
            log = str(core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE))
            assert "audit-changed.jsonl" in log, log[-2000:]
        assert_no_failed_probes(core, terminated=frozenset(old_pods))
        wait_for(cluster, "failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 60)
        refusal = unsuspend(custom, team)
        assert refusal is not None and refusal.status == 403, "not refused after the roll"

        # Uninstall as docs/install.md says: the webhook configuration (and any policy)
        # first, then the overlay.
        uninstall_at = time.monotonic()
        kubectl(cluster, "delete", "validatingwebhookconfiguration", WEBHOOK)
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            kubectl(cluster, "delete", kind, "holdwarden-hold-rules", "--ignore-not-found")
        # --ignore-not-found: the webhook configuration is gone already (docs/install.md).
        kubectl(
            cluster,
            "delete",
            "-k",
            str(overlay),
            "--ignore-not-found",
            "--timeout=180s",
            timeout=240,
        )
        installed = False
        uninstall_seconds = time.monotonic() - uninstall_at
    finally:
        if installed:
            message = diagnostics(cluster)
            subprocess.run(
                [str(ensure_kubectl(log=False)), "--kubeconfig", str(cluster.kubeconfig_path),
                 "delete", "-k", str(overlay), "--ignore-not-found", "--timeout=180s"],
                capture_output=True, timeout=240,
            )  # fmt: skip
            print(message)

    registrations = k8s.AdmissionregistrationV1Api(admin)
    hooks: Any = registrations.list_validating_webhook_configuration()
    assert [h.metadata.name for h in hooks.items] == []
    policies: Any = registrations.list_validating_admission_policy()
    assert [p.metadata.name for p in policies.items] == []
    bindings: Any = registrations.list_validating_admission_policy_binding()
    assert [b.metadata.name for b in bindings.items] == []
    assert unsuspend(custom, team) is None, "the unsuspend is still refused after the uninstall"
    report(
        f"kubectl apply -k on the real node: both replicas Ready {ready_at:.1f}s, "
        f"failurePolicy Fail {fail_at:.1f}s after the apply; a configuration change rolled "
        f"in {rollout_seconds:.1f}s; uninstall {uninstall_seconds:.1f}s"
    )
    admin.close()  # type: ignore[no-untyped-call]
