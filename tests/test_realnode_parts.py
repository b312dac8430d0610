"""The real node's parts that need no node: the image archive's layout, the Debian
packages' check, and the reaper's protocol for a node (rig/localcluster/)."""

from __future__ import annotations

import hashlib
import io
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
