"""Pods really run on the real node: the sandbox image, the ``kubernetes`` Service from
inside a Pod, a clean deletion, and a stop that leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from rig.localcluster import LocalCluster
from rig.localcluster.images import HELLO_IMAGE, PAUSE_IMAGE, build_image
from rig.localcluster.realnode import NETNS_DIR, container_cgroups
from tests.pods.conftest import report_rss

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(600)]

_WAIT_S = 120.0


def _pod(name: str, image: str, restart: str = "Always") -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            restart_policy=restart,
            termination_grace_period_seconds=5,
            containers=[k8s.V1Container(name="main", image=image, image_pull_policy="Never")],
        ),
    )


def _wait_for(what: str, cluster: LocalCluster, check: Callable[[], Any]) -> Any:
    """Poll ``check`` until it returns something truthy, or fail with the node's logs."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            tails = cluster.node.log_tails() if cluster.node is not None else ""
            pytest.fail(f"{what} not within {_WAIT_S:.0f}s\n{tails}")
        time.sleep(0.25)


def _phase(core: k8s.CoreV1Api, namespace: str, name: str) -> str | None:
    try:
        pod: Any = core.read_namespaced_pod(name, namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return str(pod.status.phase)


def _gone(core: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_pod_runs_on_the_real_node_and_is_deleted(
    pods_cluster: LocalCluster, pods_namespace: str
) -> None:
    with pods_cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespaced_pod(pods_namespace, _pod("sleeper", PAUSE_IMAGE.reference))
        _wait_for(
            "the pause Pod Running",
            pods_cluster,
            lambda: _phase(core, pods_namespace, "sleeper") == "Running",
        )
        pod: Any = core.read_namespaced_pod("sleeper", pods_namespace)
        assert pod.spec.node_name == "holdwarden-node"
        assert pod.status.pod_ip.startswith("10.244.0."), pod.status.pod_ip
        (status,) = pod.status.container_statuses
        assert status.ready and status.container_id.startswith("containerd://")
        report_rss(pods_cluster, "one Pod running")
        # A graceful deletion: the kubelet stops the container and confirms it.
        core.delete_namespaced_pod("sleeper", pods_namespace)
        _wait_for(
            "the pause Pod deleted", pods_cluster, lambda: _gone(core, pods_namespace, "sleeper")
        )


def test_pod_reaches_the_apiserver_through_the_kubernetes_service(
    pods_cluster: LocalCluster, pods_namespace: str
) -> None:
    names = pods_cluster.import_image(build_image(HELLO_IMAGE))
    assert HELLO_IMAGE.reference in " ".join(names), names
    with pods_cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespaced_pod(
            pods_namespace, _pod("hello", HELLO_IMAGE.reference, restart="Never")
        )
        phase = _wait_for(
            "the hello Pod finished",
            pods_cluster,
            lambda: (p := _phase(core, pods_namespace, "hello")) in ("Succeeded", "Failed") and p,
        )
        # The log, read through the apiserver from the kubelet on the node.
        log = core.read_namespaced_pod_log("hello", pods_namespace)
        assert phase == "Succeeded", log
        assert pods_cluster._link is not None
        service = f"https://{pods_cluster._link.service_ip}:443/version: 200 OK"
        assert service in log, log
        assert '"gitVersion": "v1.36.3"' in log, log
        core.delete_namespaced_pod("hello", pods_namespace)
        _wait_for(
            "the hello Pod deleted", pods_cluster, lambda: _gone(core, pods_namespace, "hello")
        )


def test_stop_leaves_nothing_behind() -> None:
    """A second, private cluster beside the session's: started, a Pod run, stopped while
    it runs; its namespaces, link, mounts and shims are gone."""
    before = _pod_netns()
    cluster = LocalCluster(pods=True)
    cluster.start()
    try:
        assert cluster.node is not None and cluster._link is not None
        link = cluster._link
        root = cluster.node.root
        socket = str(cluster.node.socket)
        with cluster.api_client() as api:
            namespace = cluster.create_namespace("leftovers")
            core = k8s.CoreV1Api(api)
            core.create_namespaced_pod(namespace, _pod("sleeper", PAUSE_IMAGE.reference))
            _wait_for(
                "the pause Pod Running",
                cluster,
                lambda: _phase(core, namespace, "sleeper") == "Running",
            )
            running = _pod_netns()
            containers = set(cluster.node.running_tasks())
    finally:
        cluster.stop()
    # The sandbox and the container had cgroups of their own, gone with the stop.
    assert len(containers) >= 2, containers
    assert container_cgroups(containers) == []
    # The running Pod had a network namespace of its own, and it went with the stop.
    assert running - before, (running, before)
    assert _pod_netns() <= before, (_pod_netns(), before)
    assert not (NETNS_DIR / link.netns).exists()
    assert not Path(f"/sys/class/net/{link.host_if}").exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(root) not in mounts
    links = Path("/var/log/containers")
    ours = (
        [e for e in links.iterdir() if e.is_symlink() and str(root) in os.readlink(e)]
        if links.is_dir()
        else []
    )
    assert ours == []
    shims = [
        entry.name
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _cmdline(entry).find(socket) >= 0
    ]
    assert shims == []


def test_killed_owner_leaves_nothing_behind() -> None:
    """The owner of a cluster with a running Pod is killed (SIGKILL): its reaper kills the
    processes, reaps the node (container, shim, mounts, namespaces) and removes the
    directory."""
    before = _pod_netns()
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.pods.node_owner"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()  # bounded: the owner exits within 120 s of no Pod
        assert line.startswith("RUNNING "), f"the owner ended: {line!r}, exit {owner.poll()}"
        _, workdir, netns = line.split()
        running = _pod_netns()
        assert running - before
        runc_states = Path(workdir, "node", "containerd", "runc").glob("*/*/state.json")
        containers = {state.parent.name for state in runc_states}
        assert len(containers) >= 2, containers  # the sandbox and the container
        assert container_cgroups(containers), containers
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 60
    while True:
        left = {
            "workdir": Path(workdir).exists(),
            "netns": (NETNS_DIR / netns).exists(),
            "pod netns": not _pod_netns() <= before,
            "mounts": workdir in Path("/proc/self/mountinfo").read_text(),
            "processes": any(
                workdir in _cmdline(e) for e in Path("/proc").iterdir() if e.name.isdigit()
            ),
            "cgroups": bool(container_cgroups(containers)),
        }
        if not any(left.values()):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"left behind 60 s after the owner's death: {left}")
        time.sleep(0.5)


def _pod_netns() -> set[str]:
    """The Pods' network namespaces on this machine (containerd's CRI names them cni-*)."""
    return {p.name for p in NETNS_DIR.glob("cni-*")} if NETNS_DIR.is_dir() else set()


def _cmdline(entry: Path) -> str:
    try:
        return (entry / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
