"""A process that owns a LocalCluster(pods=True) with a Pod running, for the test that
kills it (tests/pods/test_node.py): prints ``RUNNING <workdir> <netns>`` and waits."""

from __future__ import annotations

import sys
import time
from typing import Any

from kubernetes import client as k8s

from rig.localcluster import LocalCluster
from rig.localcluster.images import PAUSE_IMAGE


def main() -> None:
    cluster = LocalCluster(pods=True)
    cluster.start()
    assert cluster._link is not None
    namespace = cluster.create_namespace("owned")
    pod: Any = {
        "metadata": {"name": "sleeper"},
        "spec": {
            "containers": [
                {"name": "main", "image": PAUSE_IMAGE.reference, "imagePullPolicy": "Never"}
            ]
        },
    }
    with cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespaced_pod(namespace, pod)
        deadline = time.monotonic() + 120
        while True:
            found: Any = core.read_namespaced_pod("sleeper", namespace)
            if found.status.phase == "Running":
                break
            if time.monotonic() > deadline:
                sys.exit("the Pod did not run within 120 s")
            time.sleep(0.25)
    print(f"RUNNING {cluster.workdir} {cluster._link.netns}", flush=True)
    time.sleep(600)  # until killed


if __name__ == "__main__":
    main()
