"""The shipped image, built as ``make image`` builds it (``rig.image.build_image``, cached:
a warm run rebuilds nothing) and run as a kubelet would run the shipped Deployment: from
the exported archive (what ``ctr images import`` takes), by plain runc, with the image's
own user, entrypoint and environment, a read-only root and no writable directory at all.

It checks that the image runs as 65532:65532, that its root is read-only and nothing in it
is writable, that ``holdwarden serve --help`` works, that the installed package's version
is pyproject's, and that the CLI reads a kubeconfig with embedded certificates and talks to
the real apiserver with them.

Cold (no base, no layers), the build makes the stand-in base with mmdebstrap and builds
every layer: minutes (docs/install.md, "Building the image"). Warm, it is the layer
cache's check and the runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rig import image as image_build
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 120.0

# The cold build takes minutes; a warm one seconds. Every step inside is bounded itself.
pytestmark = pytest.mark.timeout(int(image_build.BUILD_TIMEOUT + image_build.MMDEBSTRAP_TIMEOUT))


@dataclass(frozen=True)
class Unpacked:
    rootfs: Path
    config: dict[str, Any]
    """The image config's ``config`` (User, Env, Entrypoint, Cmd, Labels, ...)."""
    tags: list[str]


def _read(archive: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A docker-archive's one manifest entry and its image config."""
    with tarfile.open(archive) as outer:
        (entry,) = json.load(_member(outer, "manifest.json"))
        return entry, json.load(_member(outer, entry["Config"]))


def _unpack(archive: Path, layers: Sequence[str], into: Path) -> None:
    """Apply a docker-archive's ``layers`` in order into ``into``, whiteouts included."""
    with tarfile.open(archive) as outer:
        for layer_name in layers:
            with tarfile.open(fileobj=_member(outer, layer_name), mode="r:*") as layer:
                keep = []
                for member in layer:
                    path = Path(member.name)
                    if path.name == ".wh..wh..opq":
                        folder = into / path.parent
                        for child in folder.iterdir() if folder.is_dir() else []:
                            _remove(child)
                    elif path.name.startswith(".wh."):
                        _remove(into / path.parent / path.name[len(".wh.") :])
                    else:
                        keep.append(member)
                layer.extractall(into, members=keep, numeric_owner=True, filter="fully_trusted")


def _member(tar: tarfile.TarFile, name: str) -> Any:
    handle = tar.extractfile(name)
    if handle is None:
        raise AssertionError(f"the image archive has no file {name}")
    return handle


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def built() -> image_build.Image:
    return image_build.build_image(quiet=True)


@pytest.fixture(scope="module")
def unpacked(built: image_build.Image) -> Unpacked:
    """The archive's root filesystem, unpacked once per set of layers (cached beside it:
    a new revision changes the image's labels, not its layers); its config read afresh."""
    entry, config = _read(built.archive)
    key = hashlib.sha256("\n".join(entry["Layers"]).encode()).hexdigest()[:12]
    folder = image_build.images_dir() / f"rootfs-{key}"
    with image_build.build_lock():  # another run may be unpacking or building
        if not folder.is_dir():
            for old in image_build.images_dir().glob("rootfs-*"):
                _remove(old)
            partial = folder.with_suffix(".partial")
            partial.mkdir(parents=True)
            _unpack(built.archive, entry["Layers"], partial / "rootfs")
            partial.rename(folder)
    return Unpacked(folder / "rootfs", config["config"], list(entry.get("RepoTags") or []))


@dataclass(frozen=True)
class Ran:
    code: int
    out: str


def run_image(
    unpacked: Unpacked,
    args: Sequence[str],
    work: Path,
    *,
    entrypoint: Sequence[str] | None = None,
    binds: Sequence[tuple[Path, str]] = (),
) -> Ran:
    """Run the image as a kubelet runs the shipped Deployment's container: the image's
    user, environment and entrypoint (unless ``entrypoint`` replaces it), a read-only root,
    no capabilities, no new privileges, no writable mount; ``binds`` read-only. The host's
    network (the local apiserver listens on 127.0.0.1)."""
    config = unpacked.config
    user, _, group = str(config.get("User", "")).partition(":")
    assert user.isdigit() and group.isdigit(), f"the image's USER is not numeric: {user!r}"
    command = [*(entrypoint if entrypoint is not None else config.get("Entrypoint") or []), *args]
    bundle = work / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir()
    none: list[str] = []
    capabilities = ("bounding", "effective", "permitted", "inheritable", "ambient")
    read_only = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
    spec = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(user), "gid": int(group)},
            "args": command,
            "env": list(config.get("Env") or []),
            "cwd": config.get("WorkingDir") or "/",
            "noNewPrivileges": True,
            "capabilities": {k: none for k in capabilities},
        },
        "root": {"path": str(unpacked.rootfs), "readonly": True},
        "hostname": "holdwarden-image-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            *({"destination": dest, "type": "bind", "source": str(src),
               "options": ["rbind", "ro", "nosuid", "nodev"]} for src, dest in binds),
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": read_only,
        },
    }  # fmt: skip
    (bundle / "config.json").write_text(json.dumps(spec))
    state = work / "runc-state"
    name = f"holdwarden-image-test-{uuid.uuid4().hex[:10]}"
    runc = ["runc", "--root", str(state)]
    try:
        done = subprocess.run(
            [*runc, "run", "--bundle", str(bundle), name],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{command} in the image ran over {RUN_TIMEOUT:.0f} s") from exc
    finally:
        subprocess.run(
            [*runc, "delete", "--force", name], capture_output=True, timeout=60, check=False
        )
    return Ran(done.returncode, done.stdout + done.stderr)


def _version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_archive_is_one_tagged_image_for_ctr(
    built: image_build.Image, unpacked: Unpacked
) -> None:
    assert built.version == _version()
    assert built.archive == image_build.images_dir() / f"holdwarden-{built.version}.tar"
    # What `image: holdwarden:<version>` resolves to, after `ctr -n k8s.io images import`.
    assert f"docker.io/library/holdwarden:{built.version}" in unpacked.tags, unpacked.tags
    config = unpacked.config
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["holdwarden"]
    assert config["Cmd"] == ["serve", "--config", "/etc/holdwarden/config.yaml"]
    assert config["Labels"]["org.opencontainers.image.version"] == built.version
    assert config["Labels"]["org.opencontainers.image.revision"] == image_build.revision()


PROBE = """
import errno, importlib.metadata, os, tempfile
print("version", importlib.metadata.version("holdwarden"))
print("ids", os.getuid(), os.getgid(), os.geteuid())
for path in ("/probe", "/etc/holdwarden/probe", "/usr/local/probe"):
    try:
        open(path, "w")
        print("wrote", path)
    except OSError as exc:
        print("refused", path, errno.errorcode[exc.errno])
try:
    print("tempdir", tempfile.gettempdir())
except OSError:
    print("tempdir none")
"""


def test_runs_as_65532_on_a_read_only_root_with_the_pyproject_version(
    unpacked: Unpacked, tmp_path: Path
) -> None:
    ran = run_image(unpacked, ["-c", PROBE], tmp_path, entrypoint=["python3"])
    assert ran.code == 0, ran.out
    lines = ran.out.splitlines()
    assert f"version {_version()}" in lines, ran.out
    assert "ids 65532 65532 65532" in lines, ran.out
    assert "refused /probe EROFS" in lines, ran.out
    assert "refused /etc/holdwarden/probe EROFS" in lines, ran.out
    assert "refused /usr/local/probe EROFS" in lines, ran.out
    # No writable directory at all: what the CLI must do without (the next test).
    assert "tempdir none" in lines, ran.out

    ran = run_image(unpacked, ["--version"], tmp_path)
    assert ran.code == 0 and _version() in ran.out, ran.out
    ran = run_image(unpacked, ["serve", "--help"], tmp_path)
    assert ran.code == 0, ran.out
    assert ran.out.startswith("usage: holdwarden serve"), ran.out


def test_the_cli_reads_embedded_certificates_on_a_read_only_root(
    unpacked: Unpacked, cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client as k8s

    with cluster.api_client() as admin:
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs",
            trainjob_body("job", suspend=True),
        )  # fmt: skip
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    kubeconfig = cluster.embedded_kubeconfig(mounted / "kubeconfig")
    (mounted / "config.yaml").write_text("mode: plain\nholder: operator\n")
    for path in (mounted / "kubeconfig", mounted / "config.yaml"):
        os.chown(path, 65532, 65532)  # the kubeconfig stays 0600, readable by 65532 only
    assert "client-key-data" in yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    common = [
        "-n", namespace, "--config", "/etc/holdwarden-test/config.yaml",
        "--kubeconfig", "/etc/holdwarden-test/kubeconfig",
    ]  # fmt: skip
    binds = [(mounted, "/etc/holdwarden-test")]
    ran = run_image(unpacked, ["status", "job", "-o", "yaml", *common], tmp_path, binds=binds)
    assert ran.code == 0, ran.out
    assert yaml.safe_load(ran.out)["state"] == "at-start-gate", ran.out
    ran = run_image(unpacked, ["status", "absent", *common], tmp_path, binds=binds)
    assert ran.code == 5 and "not found" in ran.out, ran.out


# -- the build's own pieces, without building ---------------------------------------------


def test_the_stand_in_base_is_stored_under_the_dockerfile_from_name() -> None:
    assert image_build.from_images() == ["python:3.11-slim"]  # both stages, one base
    assert image_build.qualified("python:3.11-slim") == "docker.io/library/python:3.11-slim"
    assert image_build.qualified("org/img:1") == "docker.io/org/img:1"
    assert image_build.qualified("registry.local:5000/img:1") == "registry.local:5000/img:1"


def test_every_build_command_is_bounded_and_named_when_it_fails() -> None:
    for echo in (False, True):
        with pytest.raises(image_build.ImageBuildError, match=r"probing: `sleep 30` took over"):
            image_build.run(["sleep", "30"], timeout=0.5, what="probing", echo=echo)
        with pytest.raises(image_build.ImageBuildError, match=r"exited 3:\nboom"):
            image_build.run(
                ["sh", "-c", "echo boom >&2; exit 3"], timeout=30, what="probing", echo=echo
            )
    with pytest.raises(image_build.ImageBuildError, match="not installed"):
        image_build.run(["holdwarden-no-such-tool"], timeout=5, what="probing")
    with pytest.raises(image_build.ImageBuildError, match="expected local or pull"):
        image_build.ensure_base("sometimes")
