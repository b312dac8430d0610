"""``helm install`` of the chart on the real node, as docs/install.md says (the Namespace
with its Pod Security labels first, then the chart with the image's repository and tag):
both replicas Ready, failurePolicy ``Fail``, a held unsuspend refused through the Service,
``helm test`` passing (its Pod finds the Service through the node's cluster DNS), a changed
value rolling the Pods (``helm upgrade``: the
``checksum/config`` annotation), and the documented uninstall leaving nothing that
refuses the same write."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

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
    assert_no_failed_probes,
    diagnostics,
    failure_policies,
    kubectl,
    ready_pods,
    unsuspend,
    wait_for,
)  # fmt: skip
from tests.support.tool_binaries import ensure_helm

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(1800)]

CHART = MANIFESTS.parent / "charts" / "holdwarden"


def helm(cluster: LocalCluster, tmp: Path, *args: str, timeout: float = 300) -> str:
    """Helm v3.21.4 against the cluster, its state in ``tmp``; its stdout, or the test
    fails with its output and the Pods' logs."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
        "KUBECONFIG": str(cluster.kubeconfig_path),
    }
    result = subprocess.run(
        [str(ensure_helm(log=False)), *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(
            f"helm {' '.join(args)}: exit {result.returncode}\n{result.stdout}\n"
            f"{result.stderr}\n{diagnostics(cluster)}"
        )
    return result.stdout


def test_helm_install_runs_the_enforcer_on_the_real_node(
    pods_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = pods_cluster
    built = image_build.build_image(quiet=True)
    cluster.import_image(built.archive)
    values = ["--set", "image.repository=docker.io/library/holdwarden",
              "--set", f"image.tag={built.version}"]  # fmt: skip
    admin = cluster.api_client()
    core = k8s.CoreV1Api(admin)
    apps = k8s.AppsV1Api(admin)
    custom = k8s.CustomObjectsApi(admin)
    team = cluster.create_namespace("team-helm")
    job = trainjob_body("held-job", suspend=True)
    job["metadata"]["annotations"] = dict(HOLD)
    custom.create_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, team, TRAINJOB.plural, job
    )
    installed = False
    try:
        applied_at = time.monotonic()
        kubectl(cluster, "apply", "-f", str(MANIFESTS / "namespace.yaml"))
        helm(cluster, tmp_path, "install", "holdwarden", str(CHART), "-n", NAMESPACE, *values)
        installed = True

        def both_ready() -> bool:
            deployment: Any = apps.read_namespaced_deployment("holdwarden", NAMESPACE)
            return (deployment.status.ready_replicas or 0) == 2 and len(ready_pods(core)) == 2

        wait_for(cluster, "both enforcer replicas Ready", both_ready, 240)
        ready_at = time.monotonic() - applied_at
        assert_no_failed_probes(core)
        wait_for(cluster, "failurePolicy Fail", lambda: failure_policies(admin) == ["Fail"], 180)
        fail_at = time.monotonic() - applied_at
        refusal = unsuspend(custom, team)
        assert refusal is not None and refusal.status == 403, "the held unsuspend was accepted"
        assert "held-trainjob-suspended" in str(refusal.body), refusal.body
        # `helm test`: its Pod resolves holdwarden.holdwarden-system.svc through the node's
        # cluster DNS (the run's CoreDNS) and sends the enforcer a review it must refuse.
        tested_at = time.monotonic()
        tested = helm(cluster, tmp_path, "test", "holdwarden", "-n", NAMESPACE,
                      "--timeout", "180s", timeout=240)  # fmt: skip
        assert re.search(r"TEST SUITE:\s+holdwarden-test-review", tested), tested
        assert re.search(r"Phase:\s+Succeeded", tested), tested
        test_seconds = time.monotonic() - tested_at

        # helm upgrade with a changed configuration rolls the Pods.
        old_pods = {p.metadata.name for p in ready_pods(core)}
        rolled_at = time.monotonic()
        helm(cluster, tmp_path, "upgrade", "holdwarden", str(CHART), "-n", NAMESPACE, *values,
             "--set", "config.webhook.shutdownDelay=6s")  # fmt: skip

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

        wait_for(cluster, "the Pods rolled after helm upgrade", rolled, 300)
        rollout_seconds = time.monotonic() - rolled_at

        # Uninstall as docs/install.md says for Helm.
        uninstall_at = time.monotonic()
        kubectl(cluster, "delete", "validatingwebhookconfiguration", WEBHOOK)
        helm(cluster, tmp_path, "uninstall", "holdwarden", "-n", NAMESPACE, "--wait")
        kubectl(cluster, "-n", NAMESPACE, "delete", "secret,lease", "holdwarden-certificates",
                "--ignore-not-found")  # fmt: skip
        kubectl(cluster, "delete", "namespace", NAMESPACE, "--timeout=180s", timeout=240)
        installed = False
        uninstall_seconds = time.monotonic() - uninstall_at
    finally:
        if installed:
            print(diagnostics(cluster))
            kubectl(cluster, "delete", "validatingwebhookconfiguration", WEBHOOK,
                    "--ignore-not-found")  # fmt: skip
            subprocess.run(
                [str(ensure_helm(log=False)), "uninstall", "holdwarden", "-n", NAMESPACE],
                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path),
                     "HOME": str(tmp_path)},
                capture_output=True, timeout=240,
            )  # fmt: skip
            kubectl(cluster, "delete", "namespace", NAMESPACE, "--ignore-not-found",
                    "--timeout=180s", timeout=240)  # fmt: skip
    registrations = k8s.AdmissionregistrationV1Api(admin)
    hooks: Any = registrations.list_validating_webhook_configuration()
    assert [h.metadata.name for h in hooks.items] == []
    policies: Any = registrations.list_validating_admission_policy()
    assert [p.metadata.name for p in policies.items] == []
    assert unsuspend(custom, team) is None, "the unsuspend is still refused after the uninstall"
    report(
        f"helm install on the real node: both replicas Ready {ready_at:.1f}s, failurePolicy "
        f"Fail {fail_at:.1f}s after the install; helm test passed in {test_seconds:.1f}s; "
        f"helm upgrade of the configuration rolled in "
        f"{rollout_seconds:.1f}s; uninstall {uninstall_seconds:.1f}s"
    )
    admin.close()  # type: ignore[no-untyped-call]
