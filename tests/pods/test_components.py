"""The optional components on the real node, installed as docs/install.md says (an overlay
of the base naming the component and the image):

- ``durable-audit``: the enforcer as a StatefulSet whose replicas keep their audit files on
  PersistentVolumes. A refusal's audit record is still in its replica's file, read with
  the documented ``holdwarden audit`` in the Pod, after that Pod is deleted and its
  StatefulSet makes it again on the same claim.
- ``monitoring``: the ServiceMonitor and PrometheusRule, created against the Prometheus
  Operator's own CRDs (v0.94.1, from its Go module), so that the apiserver checks them as
  it would in a cluster that runs the operator; then every enforcer Pod scraped the way
  that ServiceMonitor tells Prometheus to (the Service's port named in it, its path and
  scheme, each endpoint's address) from a Pod in the namespace ``monitoring``, where the
  NetworkPolicy admits scrapes from. The scrape shows the refusal made before it, and
  every enforcer series that the alerts and the dashboard read.

No provisioner runs here, so the durable-audit test provides the volumes as an
administrator would: two ``hostPath`` PersistentVolumes with no class, which the claims
of the StatefulSet's template (no class either) bind to.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.vocabulary import TRAINJOB
from rig import image as image_build
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster
from tests.pods.conftest import report
from tests.pods.test_install_kustomize import (
    HOLD,
    MANIFESTS,
    NAMESPACE,
    WEBHOOK,
    diagnostics,
    failure_policies,
    kubectl,
    ready_pods,
    unsuspend,
    wait_for,
)  # fmt: skip

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(1200)]

IMAGE = "docker.io/library/holdwarden"
# The Prometheus Operator whose CRDs the monitoring component is checked against: the
# newest release whose whole module the Go module proxy here serves.
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.94.1"
OPERATOR_CRDS = ("monitoring.coreos.com_servicemonitors.yaml",
                 "monitoring.coreos.com_prometheusrules.yaml")  # fmt: skip
# Series the alerts and the dashboard read that a default install does not serve: the
# gate's (holdwarden_readmission_*), from the readmission component, and the events sink's
# counter, served only with that sink on (docs/reference/metrics.md's table; the alert reads
# it with `or vector(0)`).
NOT_SERVED_BY_DEFAULT = ("holdwarden_readmission_", "holdwarden_webhook_audit_events_total")


def overlay(folder: Path, tag: str, *components: str) -> Path:
    """docs/install.md's overlay: the base, the named components, the image."""
    folder.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS, folder)],
        "components": [os.path.relpath(MANIFESTS / c, folder) for c in components],
        "images": [{"name": "holdwarden", "newName": IMAGE, "newTag": tag}],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return folder


def import_project_image(cluster: LocalCluster) -> str:
    """Import the project's image into the node; its tag."""
    # Cached: tests/controlplane/test_image.py builds it too.
    built = image_build.build_image(quiet=True)
    names = cluster.import_image(built.archive)
    assert f"{IMAGE}:{built.version}" in names, names
    return built.version


def uninstall(cluster: LocalCluster, folder: Path) -> None:
    """docs/install.md's uninstall: the webhook configuration first, then the overlay."""
    kubectl(cluster, "delete", "validatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")
    kubectl(
        cluster, "delete", "-k", str(folder), "--ignore-not-found", "--timeout=180s",
        timeout=240,
    )  # fmt: skip


def held_trainjob(cluster: LocalCluster, prefix: str) -> tuple[k8s.CustomObjectsApi, str]:
    custom = k8s.CustomObjectsApi(cluster.api_client())
    team = cluster.create_namespace(prefix)
    job = trainjob_body("held-job", suspend=True)
    job["metadata"]["annotations"] = dict(HOLD)
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, team, TRAINJOB.plural, job
    )
    return custom, team


def refused(custom: k8s.CustomObjectsApi, team: str) -> None:
    refusal = unsuspend(custom, team)
    assert refusal is not None, "the held TrainJob's unsuspend was accepted"
    assert refusal.status == 403, refusal.body
    assert "[held-trainjob-suspended]" in str(refusal.body), refusal.body


def in_pod(cluster: LocalCluster, pod: str, *command: str) -> str:
    return kubectl(cluster, "-n", NAMESPACE, "exec", pod, "-c", "enforcer", "--", *command)


# --- durable-audit ------------------------------------------------------------------------


def provide_volumes(cluster: LocalCluster, count: int) -> list[str]:
    """``count`` hostPath PersistentVolumes of 1 GiB with no class, owned by the image's
    user (a hostPath volume gets no fsGroup), as an administrator would make them."""
    core = k8s.CoreV1Api(cluster.api_client())
    names = []
    for index in range(count):
        folder = cluster.workdir / f"audit-volume-{index}"
        folder.mkdir(mode=0o750)
        os.chown(folder, 65532, 65532)
        # PersistentVolumes are cluster-wide: the name carries the run's. A digest of its
        # folder, because the folder's own name may end in "_" or "-", which a name may not
        # (a loaded run's "holdwarden-audit-0-fcpd974-" was refused).
        run = hashlib.sha256(str(cluster.workdir).encode()).hexdigest()[:8]
        name = f"holdwarden-audit-{index}-{run}"
        volume: Any = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(folder), "type": "Directory"},
            },
        }
        core.create_persistent_volume(volume)
        names.append(name)
    return names


def audit_records(cluster: LocalCluster, pod: str) -> list[dict[str, Any]]:
    """The replica's audit files as the documented command reads them."""
    out = in_pod(
        cluster, pod, "holdwarden", "audit", "--config", "/etc/holdwarden/config.yaml", "-o", "json"
    )
    records = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                records.append(dict(json.loads(line)))
            except ValueError:
                continue
    return records


def names_the_refusal(record: dict[str, Any], team: str) -> bool:
    text = json.dumps(record)
    return "held-trainjob-suspended" in text and team in text and "held-job" in text


def test_durable_audit_keeps_a_refusal_across_the_pods_deletion(
    pods_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = pods_cluster
    folder = tmp_path / "overlays" / "durable"
    tag = import_project_image(cluster)
    overlay(folder, tag, "durable-audit")
    volumes = provide_volumes(cluster, 2)
    admin = cluster.api_client()
    core = k8s.CoreV1Api(admin)
    apps = k8s.AppsV1Api(admin)
    custom, team = held_trainjob(cluster, "team-durable")
    installed = False
    try:
        kubectl(cluster, "apply", "-k", str(folder))
        installed = True

        def both_ready() -> bool:
            sts: Any = apps.read_namespaced_stateful_set("holdwarden", NAMESPACE)
            return (sts.status.ready_replicas or 0) == 2 and len(ready_pods(core)) == 2

        wait_for(cluster, "both StatefulSet replicas Ready", both_ready, 300)
        claims: Any = core.list_namespaced_persistent_volume_claim(NAMESPACE)
        bound = {c.metadata.name: c.spec.volume_name for c in claims.items}
        assert sorted(bound) == ["audit-holdwarden-0", "audit-holdwarden-1"], bound
        assert sorted(bound.values()) == sorted(volumes), bound
        wait_for(cluster, "failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 180)
        refused(custom, team)

        def replica_with_the_record() -> str | None:
            for pod in ("holdwarden-0", "holdwarden-1"):
                if any(names_the_refusal(r, team) for r in audit_records(cluster, pod)):
                    return pod
            return None

        pod = wait_for(
            cluster, "the refusal in a replica's audit file", replica_with_the_record, 60
        )
        before: Any = core.read_namespaced_pod(pod, NAMESPACE)
        deleted_at = time.monotonic()
        core.delete_namespaced_pod(pod, NAMESPACE)

        def made_again() -> bool:
            try:
                now: Any = core.read_namespaced_pod(pod, NAMESPACE)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return now.metadata.uid != before.metadata.uid and any(
                c.type == "Ready" and c.status == "True" for c in now.status.conditions or []
            )

        wait_for(cluster, f"{pod} made again and Ready", made_again, 240)
        back_seconds = time.monotonic() - deleted_at
        records = audit_records(cluster, pod)
        assert any(names_the_refusal(r, team) for r in records), (
            f"{pod}'s audit files lost the refusal across its deletion: {records[-5:]}"
        )
        # The same record is on the volume itself, where the administrator put it.
        on_disk = "".join(
            p.read_text(errors="replace")
            for v in range(2)
            for p in (cluster.workdir / f"audit-volume-{v}").glob("audit*.jsonl*")
            if p.is_file()
        )
        assert "held-trainjob-suspended" in on_disk and team in on_disk, on_disk[-2000:]
        report(f"durable-audit: {pod} deleted and Ready again in {back_seconds:.1f}s, its "
               "audit record kept")  # fmt: skip
        uninstall(cluster, folder)
        installed = False
        # The uninstall deletes the namespace and with it the claims (whenDeleted: Retain
        # keeps them only from the StatefulSet's own deletion); the files outlive it on
        # volumes whose reclaim policy is Retain, as these are (docs/install.md).
        for volume in volumes:
            released: Any = core.read_persistent_volume(volume)
            assert released.status.phase == "Released", (volume, released.status.phase)
        assert team in "".join(
            p.read_text(errors="replace")
            for v in range(2)
            for p in (cluster.workdir / f"audit-volume-{v}").glob("audit*.jsonl*")
        )
    finally:
        if installed:
            abandon(cluster, folder)
        _delete_claims_and_volumes(core, volumes)


def abandon(cluster: LocalCluster, folder: Path) -> None:
    """After a failure: print the Pods' logs and Events, then delete the overlay without
    waiting (the failure, not this, is what the test reports)."""
    print(diagnostics(cluster))
    subprocess.run(
        [*_kubectl_argv(cluster), "delete", "-k", str(folder), "--ignore-not-found",
         "--wait=false"], capture_output=True, timeout=120, check=False,
    )  # fmt: skip


def _kubectl_argv(cluster: LocalCluster) -> list[str]:
    from tests.support.tool_binaries import ensure_kubectl

    return [str(ensure_kubectl(log=False)), "--kubeconfig", str(cluster.kubeconfig_path)]


def _delete_claims_and_volumes(core: k8s.CoreV1Api, volumes: list[str]) -> None:
    for claim in ("audit-holdwarden-0", "audit-holdwarden-1"):
        try:
            core.delete_namespaced_persistent_volume_claim(claim, NAMESPACE)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for volume in volumes:
        try:
            core.delete_persistent_volume(volume)
        except ApiException as exc:
            if exc.status != 404:
                raise


# --- monitoring ---------------------------------------------------------------------------


def operator_crds() -> list[dict[str, Any]]:
    """The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, from its Go module
    (downloaded once into the Go module cache)."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local"),
    )  # fmt: skip
    assert result.returncode == 0, f"go mod download {PROMETHEUS_OPERATOR}: {result.stdout}"
    folder = Path(json.loads(result.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return [dict(yaml.safe_load((folder / name).read_text())) for name in OPERATOR_CRDS]


def create_crds(cluster: LocalCluster, crds: list[dict[str, Any]]) -> None:
    ext = k8s.ApiextensionsV1Api(cluster.api_client())
    for crd in crds:
        try:
            body: Any = crd
            ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def established() -> bool:
        for crd in crds:
            now: Any = ext.read_custom_resource_definition(crd["metadata"]["name"])
            if not any(
                c.type == "Established" and c.status == "True" for c in now.status.conditions or []
            ):
                return False
        return True

    wait_for(cluster, "the Prometheus Operator's CRDs Established", established, 60)


# Run in the scraper Pod: GET each target (scheme://address:port/path), print one JSON line
# per target: its address, status and body.
SCRAPER = """
import json, sys, urllib.request
for target in json.loads(sys.argv[1]):
    try:
        with urllib.request.urlopen(target, timeout=10) as r:
            print(json.dumps({"target": target, "status": r.status,
                              "body": r.read().decode()}))
    except Exception as e:
        print(json.dumps({"target": target, "status": None, "body": repr(e)}))
"""


def scrape_targets(core: k8s.CoreV1Api, monitor: dict[str, Any]) -> list[str]:
    """What Prometheus scrapes for ``monitor``: for each endpoint, each ready address of
    the Services its selector matches, on the Service port it names."""
    selector = ",".join(f"{k}={v}" for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    targets: list[str] = []
    for namespace in monitor["spec"]["namespaceSelector"]["matchNames"]:
        services: Any = core.list_namespaced_service(namespace, label_selector=selector)
        for service in services.items:
            endpoints: Any = core.read_namespaced_endpoints(service.metadata.name, namespace)
            for endpoint in monitor["spec"]["endpoints"]:
                for subset in endpoints.subsets or []:
                    (port,) = [p.port for p in subset.ports if p.name == endpoint["port"]]
                    targets.extend(
                        f"{endpoint['scheme']}://{a.ip}:{port}{endpoint['path']}"
                        for a in subset.addresses or []
                    )
    return targets


def series_read_by(text: str) -> set[str]:
    return set(re.findall(r"holdwarden_[a-z_]+[a-z]", text))


def test_monitoring_scrapes_every_enforcer_pod_as_its_servicemonitor_says(
    pods_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = pods_cluster
    folder = tmp_path / "overlays" / "monitored"
    tag = import_project_image(cluster)
    overlay(folder, tag, "monitoring")
    create_crds(cluster, operator_crds())
    admin = cluster.api_client()
    core = k8s.CoreV1Api(admin)
    apps = k8s.AppsV1Api(admin)
    custom, team = held_trainjob(cluster, "team-monitored")
    installed = False
    try:
        kubectl(cluster, "apply", "-k", str(folder))
        installed = True
        monitoring = k8s.CustomObjectsApi(admin)
        monitor: Any = monitoring.get_namespaced_custom_object(
            "monitoring.coreos.com", "v1", NAMESPACE, "servicemonitors", "holdwarden"
        )
        rule: Any = monitoring.get_namespaced_custom_object(
            "monitoring.coreos.com", "v1", NAMESPACE, "prometheusrules", "holdwarden"
        )

        def both_ready() -> bool:
            deployment: Any = apps.read_namespaced_deployment("holdwarden", NAMESPACE)
            return (deployment.status.ready_replicas or 0) == 2 and len(ready_pods(core)) == 2

        wait_for(cluster, "both enforcer replicas Ready", both_ready, 240)
        wait_for(cluster, "failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 180)
        refused(custom, team)

        def two_targets() -> list[str]:
            found = scrape_targets(core, monitor)
            return found if len(found) == 2 else []

        targets = wait_for(cluster, "two scrape targets in the Service's endpoints",
                           two_targets, 60)  # fmt: skip
        scraper = cluster.create_namespace("monitoring")
        assert scraper == "monitoring"
        scrape_pod: Any = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "scrape"},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "scrape",
                        "image": f"{IMAGE}:{tag}",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", "-c", SCRAPER, json.dumps(targets)],
                    }],
                },
            }  # fmt: skip
        core.create_namespaced_pod(scraper, scrape_pod)

        def scraped() -> bool:
            pod: Any = core.read_namespaced_pod("scrape", scraper)
            return bool(pod.status.phase in ("Succeeded", "Failed"))

        wait_for(cluster, "the scraper Pod finished", scraped, 180)
        log = str(core.read_namespaced_pod_log("scrape", scraper))
        results = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        assert [r["target"] for r in results] == targets, log[-3000:]
        for result in results:
            assert result["status"] == 200, result
        bodies = [r["body"] for r in results]
        # The refusal is counted by the replica that judged it.
        refusals = [
            line
            for body in bodies
            for line in body.splitlines()
            if line.startswith("holdwarden_webhook_reviews_total{")
            and 'decision="denied"' in line
            and 'rule="held-trainjob-suspended"' in line
            and float(line.rsplit(" ", 1)[1]) > 0
        ]
        assert refusals, "no scraped replica counts the refusal:\n" + "\n".join(bodies)[:4000]
        # Every enforcer series that the alerts and the dashboard read is served.
        exposed = set().union(*(series_read_by(b) for b in bodies))
        read = series_read_by(json.dumps(rule["spec"])) | series_read_by(
            (MANIFESTS / "monitoring" / "dashboard.json").read_text()
        )
        missing = sorted(
            name
            for name in read
            if not name.startswith(NOT_SERVED_BY_DEFAULT)
            and not any(e == name or e.startswith(name) for e in exposed)
        )
        assert missing == [], f"series the alerts or the dashboard read, not served: {missing}"
        report(f"monitoring: {len(targets)} targets scraped from namespace monitoring, "
               f"{len(exposed)} holdwarden series")  # fmt: skip
        uninstall(cluster, folder)
        installed = False
    finally:
        if installed:
            abandon(cluster, folder)
