"""The project's own image (``make image``, rig/image.py: a docker-archive) imported into
the real node with ``LocalCluster.import_image`` and run as a Pod, as a cluster would run
it: its user, a read-only root, no capabilities."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client as k8s

from rig import image as image_build
from rig.localcluster import LocalCluster

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(1800)]

_WAIT_S = 120.0


def test_the_project_image_runs_as_a_pod(pods_cluster: LocalCluster, pods_namespace: str) -> None:
    # Cached: tests/controlplane/test_image.py builds it too.
    built = image_build.build_image(quiet=True)
    names = pods_cluster.import_image(built.archive)
    reference = f"docker.io/library/holdwarden:{built.version}"
    assert reference in names, names
    pod: Any = {
        "metadata": {"name": "holdwarden-version"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "holdwarden",
                    "image": f"holdwarden:{built.version}",
                    "imagePullPolicy": "Never",
                    "args": ["--version"],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    with pods_cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespaced_pod(pods_namespace, pod)
        deadline = time.monotonic() + _WAIT_S
        while True:
            found: Any = core.read_namespaced_pod("holdwarden-version", pods_namespace)
            if found.status.phase in ("Succeeded", "Failed"):
                break
            if time.monotonic() > deadline:
                tails = pods_cluster.node.log_tails() if pods_cluster.node is not None else ""
                pytest.fail(f"the image's Pod not finished within {_WAIT_S:.0f}s\n{tails}")
            time.sleep(0.25)
        log = core.read_namespaced_pod_log("holdwarden-version", pods_namespace)
        assert found.status.phase == "Succeeded", log
        assert built.version in log, log
        (status,) = found.status.container_statuses
        assert status.state.terminated.exit_code == 0
        core.delete_namespaced_pod("holdwarden-version", pods_namespace)
