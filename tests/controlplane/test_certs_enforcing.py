"""certs/enforcing.py and ``holdwarden certs enforce`` on the real kube-apiserver: the
provided-certificates path (docs/install.md, "Provided certificates").

A ValidatingWebhookConfiguration as shipped (failurePolicy Ignore, no caBundle, the
annotation holdwarden.io/failure-policy) calls a real ``holdwarden serve`` with certificates
from a directory (files mode). ``certs enforce`` must leave Ignore while the enforcer cannot
be verified (no caBundle yet), set Fail once it refuses the preflight probe through the
apiserver, set Ignore without a probe when the annotation asks for it, and refuse an
annotation that is neither.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from holdwarden.vocabulary import FAILURE_POLICY_ANNOTATION
from rig.localcluster import LocalCluster
from tests.support.enforcer_tls import Pki, ServeProcess
from tests.support.shipped_webhook import local_registration, local_webhook

pytestmark = pytest.mark.controlplane

LABEL = "holdwarden.io/enforcing-test"


@pytest.fixture
def scene(
    cluster: LocalCluster, admin_client: k8s.ApiClient, tmp_path: Path
) -> Iterator[tuple[str, str, ServeProcess, Path]]:
    """(configuration name, namespace, the enforcer, certs enforce's config file)."""
    token = uuid.uuid4().hex[:10]
    namespace = cluster.create_namespace(f"enf-{token}", labels={LABEL: token})
    pki = Pki.create(tmp_path / "pki")
    server = ServeProcess(tmp_path / "serve", pki, {"shutdownDelay": "0s"})
    name = f"holdwarden-enforcing-{token}"
    body: Any = local_registration(name, local_webhook(server.port, {LABEL: token}))
    body["metadata"]["annotations"] = {FAILURE_POLICY_ANNOTATION: "Fail"}
    body["webhooks"][0]["failurePolicy"] = "Ignore"
    registrations = k8s.AdmissionregistrationV1Api(admin_client)
    registrations.create_validating_webhook_configuration(body)
    config = tmp_path / "enforce.yaml"
    config.write_text(yaml.safe_dump({"webhook": {"certificates": {"probeNamespace": namespace}}}))
    try:
        yield name, namespace, server, config
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=60)
        registrations.delete_validating_webhook_configuration(name, _request_timeout=30)


def certs(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "holdwarden.cli", "certs", *args,
               "--kubeconfig", str(cluster.kubeconfig_path)]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def policies(api: k8s.ApiClient, name: str) -> list[str]:
    config: Any = k8s.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(name)
    return [w.failure_policy for w in config.webhooks]


def annotate(api: k8s.ApiClient, name: str, value: str) -> None:
    patch = {"metadata": {"annotations": {FAILURE_POLICY_ANNOTATION: value}}}
    k8s.AdmissionregistrationV1Api(api).patch_validating_webhook_configuration(name, patch)


def test_enforce_sets_fail_only_once_the_enforcer_is_verified(
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    scene: tuple[str, str, ServeProcess, Path],
) -> None:
    name, namespace, server, config = scene
    # No caBundle yet: the apiserver cannot verify the enforcer, so the probe is not
    # refused by it (with Ignore it is let through) and the policy stays Ignore.
    before = certs(cluster, "enforce", "--webhook-config", name, "--config", str(config))
    assert before.returncode == 1, before.stdout + before.stderr
    assert "stays Ignore until the enforcer is verified" in before.stdout, before.stdout
    assert f"probe in namespace {namespace}" in before.stdout
    assert policies(admin_client, name) == ["Ignore"]

    injected = certs(
        cluster,
        "inject",
        "--webhook-config",
        name,
        "--ca-bundle",
        str(server.pki.directory / "ca.crt"),
    )
    assert injected.returncode == 0, injected.stderr
    after = certs(
        cluster, "enforce", "--webhook-config", name, "--config", str(config), "--wait", "60s"
    )
    assert after.returncode == 0, after.stdout + after.stderr
    assert "failurePolicy set to Fail" in after.stdout, after.stdout
    assert policies(admin_client, name) == ["Fail"]
    # Once there, nothing to do.
    again = certs(cluster, "enforce", "--webhook-config", name, "--config", str(config))
    assert again.returncode == 0 and "failurePolicy is Fail" in again.stdout, again.stdout

    # Beside the policy (defence in depth) the annotation asks for Ignore: set at once.
    annotate(admin_client, name, "Ignore")
    ignore = certs(cluster, "enforce", "--webhook-config", name, "--config", str(config))
    assert ignore.returncode == 0 and "failurePolicy set to Ignore" in ignore.stdout
    assert policies(admin_client, name) == ["Ignore"]

    annotate(admin_client, name, "Sometimes")
    bad = certs(cluster, "enforce", "--webhook-config", name, "--config", str(config))
    assert bad.returncode == 2
    assert f"{FAILURE_POLICY_ANNOTATION}='Sometimes' is not Fail or Ignore" in bad.stderr
    assert policies(admin_client, name) == ["Ignore"]


def test_enforce_names_a_missing_configuration(cluster: LocalCluster) -> None:
    missing = certs(cluster, "enforce", "--webhook-config", f"absent-{uuid.uuid4().hex[:6]}")
    assert missing.returncode == 2
    assert "not found" in missing.stderr
