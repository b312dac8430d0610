"""The real node's parts that need no node: the image archive's layout, the Debian
packages' check, the reaper's protocol for a node, how a real node and kwok nodes share
a cluster, and the reading of containerd's tasks (rig/localcluster/)."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
from pathlib import Path

import pytest

from rig.localcluster import hostpackages, reaper
from rig.localcluster.images import HELLO_IMAGE, image_archive


def test_an_image_archive_is_a_docker_save_layout_whose_layer_is_the_program() -> None:
    archive = image_archive(HELLO_IMAGE, b"\x7fELF program")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        (entry,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert entry["RepoTags"] == [HELLO_IMAGE.reference]
        config = json.load(tar.extractfile(entry["Config"]))  # type: ignore[arg-type]
        (layer_name,) = entry["Layers"]
        layer = tar.extractfile(layer_name).read()  # type: ignore[union-attr]
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    assert config["config"]["Entrypoint"] == ["/hello"]
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    with tarfile.open(fileobj=io.BytesIO(layer)) as files:
        member = files.getmember("hello")
        assert member.mode == 0o755
        assert files.extractfile(member).read() == b"\x7fELF program"  # type: ignore[union-attr]


def test_missing_packages_without_root_name_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        hostpackages, "PACKAGES", {"containerd": tmp_path / "none", "runc": tmp_path}
    )
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(hostpackages.HostPackagesMissing) as caught:
        hostpackages.ensure_host_packages(log=False)
    assert "apt-get install -y --no-install-recommends containerd" in str(caught.value)


def test_present_packages_install_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(hostpackages, "PACKAGES", {"runc": tmp_path})
    monkeypatch.setattr(hostpackages, "_apt", lambda _: pytest.fail("apt-get was run"))
    hostpackages.ensure_host_packages(log=False)


def test_the_reaper_reaps_an_announced_node_after_the_kill(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rig.localcluster import realnode

    reaped: list[tuple[Path, str, str]] = []
    monkeypatch.setattr(
        realnode, "reap_node", lambda root, netns, host_if: reaped.append((root, netns, host_if))
    )
    work = tmp_path / "work"
    work.mkdir()
    reaper.run(work, io.StringIO(f"node holdwarden-1-abcdef hwabcdefh {work / 'node'}\n"))
    assert reaped == [(work / "node", "holdwarden-1-abcdef", "hwabcdefh")]
    assert not work.exists()
    # Dismissed: nothing is reaped.
    work.mkdir()
    reaper.run(work, io.StringIO(f"node holdwarden-1-abcdef hwabcdefh {work}\ndone\n"))
    assert len(reaped) == 1 and work.exists()


_LIFECYCLE = {"node-lifecycle-controller", "taint-eviction-controller",
              "pod-garbage-collector-controller"}  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "nodes", "controllers", "short_timings"),
    [
        (False, False, {"job-controller", "garbage-collector-controller"}, False),
        (False, True, {"job-controller", "garbage-collector-controller", *_LIFECYCLE}, True),
        # "*": kube-controller-manager's default set, the node lifecycle's three included.
        (True, False, {"*"}, False),
        (True, True, {"*"}, True),
    ],
)
def test_kube_controller_manager_runs_the_node_lifecycle_with_the_timings_of_kwok_nodes(
    pods: bool, nodes: bool, controllers: set[str], short_timings: bool
) -> None:
    from rig.localcluster.controllers import NODE_LIFECYCLE_FLAGS, kcm_selection

    selected, flags = kcm_selection(pods=pods, nodes=nodes)
    assert set(selected) == controllers
    expected = [f"--{flag}={value}" for flag, (value, _) in NODE_LIFECYCLE_FLAGS.items()]
    assert flags == (expected if short_timings else [])


def test_kwok_nodes_never_hand_out_the_real_nodes_pod_addresses() -> None:
    from rig.localcluster.nodes import NODE_LABEL, node_body
    from rig.localcluster.realnode import NODE_NAME, POD_SUBNET

    real = ipaddress.ip_network(POD_SUBNET)
    for index in range(5):
        body = node_body(f"kwok-{index}", index)
        cidr = ipaddress.ip_network(body["spec"]["podCIDR"])
        assert body["spec"]["podCIDRs"] == [str(cidr)]
        assert not cidr.overlaps(real), (index, cidr)
        # Each kwok manages the node with its label; the real node has none.
        assert body["metadata"]["labels"][NODE_LABEL] == f"kwok-{index}" != NODE_NAME


def test_a_real_node_and_kwok_nodes_mix() -> None:
    from rig.localcluster import LocalCluster

    cluster = LocalCluster(pods=True, nodes=1)
    # The real node brings the kube-controller-manager that kwok nodes need.
    assert "kube-controller-manager" in cluster._controller_names
    assert (cluster.pods, cluster.node_count) == (True, 1)


def test_running_tasks_are_the_running_rows_of_ctr_tasks_ls() -> None:
    from rig.localcluster.realnode import running_tasks

    listing = (
        "TASK                                                                PID     STATUS\n"
        "0f3c9a2b7d1e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c    4321    RUNNING\n"
        "aa11                                                                0       STOPPED\n"
        "bb22                                                                77      PAUSED\n"
    )
    assert running_tasks(listing) == {
        "0f3c9a2b7d1e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c": 4321
    }
    assert running_tasks("TASK    PID    STATUS\n") == {}


def test_a_containers_cgroups_are_removed_in_every_hierarchy_once_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rig.localcluster import realnode

    monkeypatch.setattr(realnode, "CGROUP_FS", tmp_path)
    monkeypatch.setattr(realnode, "CGROUP_RMDIR_SECONDS", 0.3)
    gone, busy, other_run = "a" * 64, "b" * 64, "c" * 64
    for hierarchy in ("cpu", "memory", "unified"):
        for container in (gone, busy, other_run):
            (tmp_path / hierarchy / "k8s.io" / container).mkdir(parents=True)
    # A cgroup that still holds something cannot be removed (rmdir of a non-empty folder
    # fails as the kernel's rmdir of a cgroup with a process does).
    (tmp_path / "memory" / "k8s.io" / busy / "tasks").write_text("1\n")
    left = realnode.remove_container_cgroups([gone, busy, "../../etc", "k8s.io"])
    assert left == [tmp_path / "memory" / "k8s.io" / busy]
    assert realnode.container_cgroups([gone]) == []
    assert realnode.container_cgroups([other_run]) == [
        tmp_path / h / "k8s.io" / other_run for h in ("cpu", "memory", "unified")
    ]
    assert realnode.container_cgroups(["../k8s.io", "x" * 64]) == []
