"""The Helm CLI the chart tests render with, built once from the Go module proxy.

``python -m tests.helm_binary`` (part of ``make binaries``) builds ``helm.sh/helm/v3/cmd/helm``
at ``HELM_VERSION`` from the committed module in ``tools/helm`` (go.mod/go.sum pin every
dependency; ``-mod=readonly``, so the build never resolves a version on its own) into
``$HOLDWARDEN_CACHE``, beside kube-apiserver. ``HOLDWARDEN_HELM`` may name a prebuilt
``helm`` instead (its version is then the caller's responsibility).

Like holdwarden/localcluster/binaries.py: the build writes ``helm.partial`` and renames it
into place under a file lock, so an interrupted or concurrent build never leaves a
half-written binary; with no Go and no binary it raises ``BinariesUnavailable``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from holdwarden.localcluster.binaries import BinariesUnavailable, cache_dir

HELM_VERSION = "v3.21.4"
MODULE = Path(__file__).resolve().parent.parent / "tools" / "helm"
_MODULE_FILES = ("go.mod", "go.sum", "tools.go")


def helm_path() -> Path:
    """Where the built helm is cached: the folder names its version and its go.sum's hash,
    so a changed module builds a new binary rather than reusing an old one."""
    digest = hashlib.sha256()
    for name in _MODULE_FILES:
        digest.update((MODULE / name).read_bytes())
    return cache_dir() / f"helm-{HELM_VERSION}-{digest.hexdigest()[:12]}" / "helm"


def ensure_helm(log: bool = True) -> Path:
    """The helm executable: ``$HOLDWARDEN_HELM``, else the cached build, else built now."""
    prebuilt = os.environ.get("HOLDWARDEN_HELM")
    if prebuilt:
        path = Path(prebuilt)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BinariesUnavailable(f"HOLDWARDEN_HELM={path} is not an executable file")
        return path
    target = helm_path()
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise BinariesUnavailable(
            f"helm {HELM_VERSION} is not cached and 'go' is not on PATH: install Go >= 1.26 "
            "or set HOLDWARDEN_HELM to a helm v3 binary"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # built by another process while we waited
            return target
        partial = target.with_suffix(".partial")
        ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"
        command = [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(partial),
                   "helm.sh/helm/v3/cmd/helm"]  # fmt: skip
        env = dict(os.environ, GOFLAGS="-mod=readonly", GOTOOLCHAIN="local", CGO_ENABLED="0")
        if log:
            print(
                f"holdwarden: building helm {HELM_VERSION} from the Go module proxy into "
                f"{target.parent} (once; about 8 minutes on 2 busy cores)",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        result = subprocess.run(command, cwd=MODULE, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BinariesUnavailable(
                f"building helm failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
            )
        partial.rename(target)
        if log:
            print(
                f"holdwarden: built helm in {time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    return target


def main() -> int:
    try:
        print(f"helm: {ensure_helm()}")
    except BinariesUnavailable as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
