"""Container images for the real node, made here from static Go programs: no base image.

Nothing can be pulled from a registry on these machines, so the real node's images are
each one static binary (``CGO_ENABLED=0``, standard library only) in a single-layer
image archive in the Docker ``save`` layout (``manifest.json``, the config, one layer
tar), which ``ctr images import`` reads as it reads any other archive:

- ``PAUSE_IMAGE``: the sandbox image containerd's CRI starts for every Pod
  (``nodeimages/pause``: waits for SIGTERM, reaps children);
- ``HELLO_IMAGE``: ``nodeimages/hello``, which GETs the apiserver's ``/version`` through
  the ``kubernetes`` Service with the Pod's token and exits 0.

Each binary is built once into the cache like the controllers (``binaries.go_build``:
file lock, ``.partial`` then rename; the folder names a hash of its sources); the archive
is written beside it the same way. ``LocalCluster.import_image(path)`` imports any image
archive, these or one built elsewhere (an OCI or Docker archive).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rig.localcluster.binaries import cache_dir, go_build

_FILES = ("go.mod", "main.go")


@dataclass(frozen=True)
class NodeImage:
    """An image made of one static Go program: its reference and its source folder."""

    reference: str
    program: str

    @property
    def entrypoint(self) -> str:
        return f"/{self.program}"


PAUSE_IMAGE = NodeImage("holdwarden.local/pause:1", "pause")
HELLO_IMAGE = NodeImage("holdwarden.local/hello:1", "hello")


def _source_digest(program: str) -> str:
    source = resources.files("rig.localcluster") / "nodeimages" / program
    digest = hashlib.sha256()
    for name in _FILES:
        digest.update((source / name).read_bytes())
    return digest.hexdigest()[:12]


def _layer(binary: bytes, name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(binary)
        info.mode = 0o755
        info.mtime = 0
        tar.addfile(info, io.BytesIO(binary))
    return buffer.getvalue()


def image_archive(image: NodeImage, binary: bytes) -> bytes:
    """A Docker-``save`` archive of one layer holding ``binary`` as ``/<program>``."""
    layer = _layer(binary, image.program)
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [image.entrypoint], "User": "65534:65534"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
            "history": [{"created_by": f"holdwarden rig: static Go program {image.program}"}],
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [
            {
                "Config": config_name,
                "RepoTags": [image.reference],
                "Layers": [f"{layer_digest}/layer.tar"],
            }
        ]
    ).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (
            (f"{layer_digest}/layer.tar", layer),
            (config_name, config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_image(image: NodeImage) -> Path:
    """The image's archive in the cache, its program built first if needed (once)."""
    folder = cache_dir() / f"image-{image.program}-{_source_digest(image.program)}"
    archive = folder / f"{image.program}.tar"
    if archive.is_file():
        return archive
    binary = go_build(
        folder / image.program,
        resources.files("rig.localcluster") / "nodeimages" / image.program,
        _FILES,
        ".",
        "-s -w",
        f"the {image.program} image's program",
        "-mod=readonly",
        False,  # the standard library only: a second or two, nothing to announce
        missing_go_hint="install Go to build the real node's images",
    )
    partial = archive.with_suffix(".partial")
    partial.write_bytes(image_archive(image, binary.read_bytes()))
    partial.rename(archive)
    return archive
