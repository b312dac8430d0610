"""The Debian packages a real node needs, installed from here when missing.

``LocalCluster(pods=True)`` runs containerd, runc, the CNI plugins and kube-proxy's
iptables on this machine. They come from Debian, not from the Go module proxy:

- ``containerd`` (1.6 on bookworm) and ``runc`` (not ``crun``: crun 1.8 refuses the
  hybrid cgroup layout of these machines);
- ``containernetworking-plugins`` (``bridge``, ``host-local``, ``portmap``, ``loopback``
  in ``/usr/lib/cni``);
- ``iptables`` and ``conntrack`` (kube-proxy's iptables mode).

``ensure_host_packages()`` checks for each one's files and, when any is missing, runs
``apt-get install`` non-interactively (``apt-get update`` first), saying so on stderr. It
needs root; without it, it raises ``HostPackagesMissing`` naming the command to run.
``make node-packages`` (and so ``make binaries``) calls it: nothing is installed by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CNI_BIN_DIR = Path("/usr/lib/cni")

# package -> a file that proves it is installed
PACKAGES: dict[str, Path] = {
    "containerd": Path("/usr/bin/containerd"),
    "runc": Path("/usr/sbin/runc"),
    "containernetworking-plugins": CNI_BIN_DIR / "bridge",
    "iptables": Path("/usr/sbin/iptables"),
    "conntrack": Path("/usr/sbin/conntrack"),
}


class HostPackagesMissing(RuntimeError):
    """A Debian package the real node needs is missing and could not be installed."""


def missing_packages() -> list[str]:
    return [name for name, path in PACKAGES.items() if not path.exists()]


def _apt(arguments: Sequence[str]) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    command = ["apt-get", "-q", "-y", *arguments]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise HostPackagesMissing(
            f"{' '.join(command)} failed (exit {result.returncode}):\n"
            f"{(result.stdout + result.stderr)[-3000:]}"
        )


def ensure_host_packages(log: bool = True) -> None:
    """Install the missing packages of ``PACKAGES`` (apt-get, non-interactive), or raise."""
    missing = missing_packages()
    if not missing:
        return
    install = f"apt-get install -y --no-install-recommends {' '.join(missing)}"
    if shutil.which("apt-get") is None:
        raise HostPackagesMissing(
            f"a real node needs the Debian packages {missing}, and there is no apt-get here"
        )
    if os.geteuid() != 0:
        raise HostPackagesMissing(
            f"a real node needs the Debian packages {missing}; as root: {install}"
        )
    if log:
        print(
            f"holdwarden: installing {', '.join(missing)} for the real node (apt-get, once)",
            file=sys.stderr,
            flush=True,
        )
    _apt(["update"])
    _apt(["install", "--no-install-recommends", *missing])
    still = missing_packages()
    if still:
        raise HostPackagesMissing(f"apt-get installed, yet these are still missing: {still}")


def main() -> int:
    try:
        ensure_host_packages()
    except HostPackagesMissing as exc:
        print(f"holdwarden: {exc}", file=sys.stderr)
        return 1
    print("host packages for the real node: " + ", ".join(PACKAGES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
