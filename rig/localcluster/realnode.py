"""A real node for the local control plane: containerd, runc, CNI, kubelet, kube-proxy.

``LocalCluster(pods=True)`` runs, besides etcd, kube-apiserver, kube-controller-manager
(its ordinary controllers) and kube-scheduler, one real node whose Pods really run:

- **Its own network namespace**, ``holdwarden-<owner pid>-<token>`` (``/run/netns``),
  joined to the host by a veth pair on a /30 of 100.64.0.0/10 drawn per run. The
  apiserver listens on the host end (``LINK.host``), which a Pod can reach; the node's
  InternalIP is the other end. Everything a node changes in the network (kube-proxy's
  ``KUBE-*`` chains, the CNI bridge and its masquerade rules, the ports 10250/10256 the
  kubelet and kube-proxy bind) is inside that namespace, so a second run on the same
  machine collides with nothing, and deleting the namespace removes all of it.
- **containerd** (Debian's 1.6, ``hostpackages.py``) with its root, state, socket, CNI
  configuration and runc root in the run's working directory, and
  ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE: without it every sandbox
  fails with "can't get final child's PID from pipe"). runc, not crun (crun 1.8 refuses
  the hybrid cgroup layout). CNI: Debian's ``bridge`` (bridge ``hw0``, 10.244.0.0/24,
  masquerade), ``host-local`` (its data in the run's directory), ``portmap``.
- **kubelet** v1.36.3 (built like kube-controller-manager) as ``system:node:<name>``,
  ``failCgroupV1: false``, ``cgroupDriver: cgroupfs``, ``cgroupsPerQOS: false`` (no shared
  ``/kubepods`` cgroup; each container's cgroup is named by its own id), its root and pod
  logs in the run's directory, x509 client authentication against the run's CA (the
  apiserver calls it with the admin certificate, ``--kubelet-preferred-address-types=
  InternalIP``). Beside kwok nodes (``LocalCluster(pods=True, nodes=N)``, nodes.py) it
  renews its Lease every 2.5 s, as they do, for the node lifecycle's short grace.
- **kube-proxy** v1.36.3, iptables mode, as ``system:kube-proxy``; it carries Pods to the
  ``kubernetes`` Service (the first address of the run's Service range, a /24 of
  10.96.0.0/12 drawn with the link), whose endpoint the apiserver keeps (the lease
  reconciler, with the link address advertised). The host routes that range into the
  node's namespace, so the apiserver reaches a Service's cluster IP too (an admission
  webhook's ``clientConfig.service``) through kube-proxy's rules, as a Pod does.
- **CoreDNS** v1.13.1 (``controllerbuild/coredns``: a main of the project's own linking
  only the plugins used), in the node's namespace on ``LINK.node`` port 53, the kubelet's
  ``clusterDNS``: Pods resolve ``<service>.<namespace>.svc`` (``cluster.local``). It reads
  the API as ``holdwarden:coredns`` (a client certificate of the run's CA, a ClusterRole of
  the kubernetes plugin's reads); other names are refused (no upstream is reachable).
- The images: the sandbox image ``images.PAUSE_IMAGE`` (a static Go program) is imported
  before the kubelet starts; ``import_image(path)`` imports any image archive into the
  CRI's namespace (``ctr -n k8s.io images import``, no registry).

Invariants: ``start`` returns when the node is Ready and schedulable, kube-proxy has
synced its rules (its healthz answers 200) and CoreDNS is ready, or raises
``ControlPlaneError`` with the log tails of containerd, kubelet, kube-proxy and CoreDNS.
``LocalCluster.stop`` first kills and deletes every container through containerd's
``k8s.io`` namespace (``drain``, noting the Pods' network namespaces and the containers'
ids), stops the processes, then ``reap_node`` removes the rest:
containers left in runc's state, this run's shims, every mount under the node's
directory, the Pods' ``cni-*`` namespaces, the kubelet's ``/var/log/containers`` links
into the run, the containers' cgroups (``/k8s.io/<id>`` in each hierarchy, which
containerd leaves behind for a container killed rather than deleted), and the node's
namespace (the veth pair goes with it). A killed owner's
reaper calls ``reap_node`` too (``Reaper.announce_node``); a run whose reaper died as
well is reaped by the next start (``sweep_stale_nodes``: a namespace named for a dead
owner pid, its directory read from ``/run/holdwarden-node-<namespace>``).
Needs root (network namespaces, mounts, iptables) and ``ip``/``nsenter`` (iproute2,
util-linux).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client as k8s

from holdwarden.certs.generate import generate_client
from rig.localcluster.binaries import cache_dir, controller_binaries
from rig.localcluster.errors import ControlPlaneError
from rig.localcluster.hostpackages import CNI_BIN_DIR, ensure_host_packages
from rig.localcluster.images import PAUSE_IMAGE, build_image
from rig.localcluster.nodes import NODE_LEASE_SECONDS, node_ready

if TYPE_CHECKING:
    from rig.localcluster.cluster import LocalCluster

NODE_NAME = "holdwarden-node"
CONTAINER_LOG_LINKS = Path("/var/log/containers")
NETNS_DIR = Path("/run/netns")
NETNS_PREFIX = "holdwarden-"
CRI_NAMESPACE = "k8s.io"
# With ``cgroupsPerQOS: false`` containerd gives each container the cgroup
# ``/<CRI namespace>/<container id>`` in every hierarchy, shared with every other run, and
# leaves it behind when a container is killed rather than deleted.
CGROUP_FS = Path("/sys/fs/cgroup")
CGROUP_RMDIR_SECONDS = 10.0
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
POD_SUBNET = "10.244.0.0/24"
BRIDGE = "hw0"
CLUSTER_DOMAIN = "cluster.local"
# CoreDNS's ports, in the node's namespace: DNS on the node's end of the link (a Pod's
# resolv.conf names no port), its readiness on the same address.
DNS_PORT = 53
DNS_READY_PORT = 8181
COREDNS_USER = "holdwarden:coredns"
_LINK_POOL = ipaddress.ip_network("100.64.0.0/10")
# Each run's Service range, a /24 of this pool drawn with its link: the host routes it to
# the node's namespace, so two runs on one machine must not share one.
_SERVICE_POOL = ipaddress.ip_network("10.96.0.0/12")
_READY_TIMEOUT_S = 120.0
_CLONE_NEWNET = 0x40000000


class _Failure(RuntimeError):
    pass


def _run(command: list[str], *, check: bool = True, timeout: float = 60) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise ControlPlaneError(
            f"{' '.join(command)} failed (exit {result.returncode}): "
            f"{(result.stdout + result.stderr)[-2000:]}"
        )
    return result.stdout


def enter_netns(path: Path) -> None:
    """Join the network namespace at ``path`` (in a child, before exec)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Link:
    """The veth pair between the host and the node's namespace, on one /30."""

    netns: str
    host_if: str
    host: str
    node: str
    services: str
    """This run's --service-cluster-ip-range (a /24), routed from the host to the node."""

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def service_ip(self) -> str:
        """The ``kubernetes`` Service's cluster IP (the range's first address)."""
        return str(next(ipaddress.ip_network(self.services).hosts()))


def _addresses_in_use() -> set[ipaddress.IPv4Network]:
    used: set[ipaddress.IPv4Network] = set()
    for line in _run(["ip", "-4", "-o", "addr", "show"]).splitlines():
        match = re.search(r"inet (\S+)", line)
        if match:
            used.add(ipaddress.ip_interface(match.group(1)).network)  # type: ignore[arg-type]
    return used


def _routes_in_use() -> set[ipaddress.IPv4Network]:
    used: set[ipaddress.IPv4Network] = set()
    for line in _run(["ip", "-4", "-o", "route", "show"]).splitlines():
        first = line.split()[0] if line.split() else ""
        if first and first != "default":
            with contextlib.suppress(ValueError):
                used.add(ipaddress.IPv4Network(first, strict=False))
    return used


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def create_link() -> Link:
    """A fresh network namespace and veth pair on a /30 no interface here uses.

    Drawn under a machine-wide file lock, so two runs starting together never pick the
    same /30."""
    token = f"{random.randrange(16**6):06x}"
    netns = f"{NETNS_PREFIX}{os.getpid()}-{token}"
    host_if = f"hw{token}h"
    lock_path = cache_dir() / ".netns.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        used = _addresses_in_use()
        for _ in range(1000):
            base = int(_LINK_POOL.network_address) + 4 * random.randrange(
                _LINK_POOL.num_addresses // 4
            )
            subnet = ipaddress.ip_network(f"{ipaddress.ip_address(base)}/30")
            if not any(subnet.overlaps(network) for network in used):
                break
        else:
            raise ControlPlaneError("no free /30 in 100.64.0.0/10 for the node's link")
        routed = _routes_in_use()
        for _ in range(1000):
            start = int(_SERVICE_POOL.network_address) + 256 * random.randrange(
                _SERVICE_POOL.num_addresses // 256
            )
            services = ipaddress.ip_network(f"{ipaddress.ip_address(start)}/24")
            if not any(services.overlaps(network) for network in routed | used):
                break
        else:
            raise ControlPlaneError("no free /24 in 10.96.0.0/12 for the node's Services")
        host, node = (str(address) for address in list(subnet.hosts())[:2])
        link = Link(netns, host_if, host, node, str(services))
        try:
            _run(["ip", "netns", "add", netns])
            _run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0",
                  "netns", netns])  # fmt: skip
            _run(["ip", "addr", "add", f"{host}/30", "dev", host_if])
            _run(["ip", "link", "set", host_if, "up"])
            inside = ["ip", "-n", netns]
            _run([*inside, "addr", "add", f"{node}/30", "dev", "eth0"])
            _run([*inside, "link", "set", "eth0", "up"])
            _run([*inside, "link", "set", "lo", "up"])
            _run([*inside, "route", "add", "default", "via", host])
            # The apiserver (on the host) reaches Services as Pods do: their cluster IPs
            # are routed into the node's namespace, where kube-proxy's rules carry them to
            # the Pods (admission webhooks behind a Service). The route goes with the veth.
            _run(["ip", "route", "add", str(services), "via", node, "dev", host_if])
            # Pods' packets to the apiserver are forwarded from the bridge to eth0.
            _run(["nsenter", f"--net={link.netns_path}", "sysctl", "-qw",
                  "net.ipv4.ip_forward=1"])  # fmt: skip
        except BaseException:
            delete_link(link)
            raise
    return link


def delete_link(link: Link) -> None:
    """Delete the namespace (its end of the veth, and so the pair, goes with it)."""
    _run(["ip", "netns", "delete", link.netns], check=False)
    _run(["ip", "link", "delete", link.host_if], check=False)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == str(root) or point.startswith(prefix):
                found.append(point)
    return found


def unmount_under(root: Path) -> None:
    """Detach every mount at or under ``root``, deepest first."""
    for _ in range(5):
        points = _mounts_under(root)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            _run(["umount", "--lazy", point], check=False)


def _processes_naming(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (a run's own socket path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def _runc_leftovers(root: Path) -> tuple[list[int], set[str], set[str]]:
    """From runc's state files under the node's runc root: each container's init pid, the
    Pods' network namespaces (cni-*) they joined, and the containers' ids."""
    pids: list[int] = []
    netns: set[str] = set()
    ids: set[str] = set()
    for state_file in (root / "containerd" / "runc").glob("*/*/state.json"):
        ids.add(state_file.parent.name)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            state = json.loads(state_file.read_text())
            if state.get("init_process_pid"):
                pids.append(int(state["init_process_pid"]))
            for space in state["config"]["namespaces"] or []:
                path = space.get("path") or ""
                if space.get("type") == "NEWNET" and "/netns/cni-" in path:
                    netns.add(Path(path).name)
    return pids, netns, ids


def container_cgroups(container_ids: Iterable[str]) -> list[Path]:
    """The cgroups containerd made for these containers that exist now, in every hierarchy
    (cgroup v1's and the unified one). Only well-formed ids count: a name is never a path."""
    ids = [i for i in container_ids if _CONTAINER_ID.fullmatch(i)]
    if not ids or not CGROUP_FS.is_dir():
        return []
    parents = [CGROUP_FS / CRI_NAMESPACE]
    with contextlib.suppress(OSError):
        parents += [h / CRI_NAMESPACE for h in sorted(CGROUP_FS.iterdir()) if h.is_dir()]
    return [parent / i for parent in parents for i in ids if (parent / i).is_dir()]


def remove_container_cgroups(container_ids: Iterable[str]) -> list[Path]:
    """Remove these containers' cgroups once their processes are gone; returns those still
    there after ``CGROUP_RMDIR_SECONDS`` (a process that has not exited yet keeps its
    cgroup busy). ``rmdir`` removes only an empty cgroup, never another run's processes."""
    left = container_cgroups(container_ids)
    deadline = time.monotonic() + CGROUP_RMDIR_SECONDS
    while left:
        busy = []
        for cgroup in left:
            try:
                cgroup.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                busy.append(cgroup)
        left = busy
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return left


def reap_node(
    root: Path,
    netns: str,
    host_if: str,
    pod_netns: Iterable[str] = (),
    container_ids: Iterable[str] = (),
) -> None:
    """Remove what a node leaves once its processes are stopped or killed: containers
    still running (runc's state), this run's shims, mounts under ``root``, the Pods'
    network namespaces, the containers' cgroups (``container_ids`` and runc's state), the
    node's namespace and link. Idempotent; used by ``stop``, by the reaper when the owner
    died, and by ``sweep_stale_nodes``."""
    inits, from_state, ids_in_state = _runc_leftovers(root)
    for pid in [*inits, *_processes_naming(str(root / "containerd" / "containerd.sock"))]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    unmount_under(root)
    # The kubelet links each container's log into /var/log/containers (a fixed path, not
    # under podLogsDir); this run's links point into its directory.
    with contextlib.suppress(OSError):
        for entry in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if entry.is_symlink() and os.readlink(entry).startswith(f"{root}/"):
                    entry.unlink()
    for name in sorted({*pod_netns, *from_state}):
        if (NETNS_DIR / name).exists():
            _run(["ip", "netns", "delete", name], check=False)
    remove_container_cgroups({*container_ids, *ids_in_state})
    delete_link(Link(netns, host_if, "", "", ""))
    Path(f"/run/holdwarden-node-{netns}").unlink(missing_ok=True)


def sweep_stale_nodes() -> list[str]:
    """Reap the nodes of runs whose owner process is dead (its reaper killed too)."""
    removed: list[str] = []
    if not NETNS_DIR.is_dir():
        return removed
    for entry in NETNS_DIR.iterdir():
        match = re.fullmatch(rf"{NETNS_PREFIX}(\d+)-([0-9a-f]{{6}})", entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        marker = Path(f"/run/holdwarden-node-{entry.name}")
        if marker.is_file():
            reap_node(Path(marker.read_text().strip()), entry.name, f"hw{match.group(2)}h")
        else:
            delete_link(Link(entry.name, f"hw{match.group(2)}h", "", "", ""))
        removed.append(entry.name)
    return removed


def _client_kubeconfig(cluster: LocalCluster, user: str, groups: list[str], folder: Path) -> Path:
    assert cluster.ca is not None
    pair = generate_client(cluster.ca, user, organizations=groups)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "client.crt").write_bytes(pair.cert_pem)
    (folder / "client.key").write_bytes(pair.key_pem)
    (folder / "client.key").chmod(0o600)
    credentials = {
        "client-certificate": str(folder / "client.crt"),
        "client-key": str(folder / "client.key"),
    }
    return cluster.user_kubeconfig(folder / "kubeconfig", user, credentials)


def running_tasks(listing: str) -> dict[str, int]:
    """{container id: pid} of the RUNNING rows of ``ctr tasks ls`` (columns TASK, PID,
    STATUS; the header and any other status are left out)."""
    found: dict[str, int] = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2] == "RUNNING" and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return found


class RealNode:
    """One real node of a LocalCluster; see the module's invariants."""

    def __init__(self, cluster: LocalCluster, link: Link) -> None:
        self.cluster = cluster
        self.link = link
        self.name = NODE_NAME
        self.root = cluster.workdir / "node"
        self.socket = self.root / "containerd" / "containerd.sock"
        self.pids: dict[str, int] = {}
        self.phase_seconds: dict[str, float] = {}
        self._marker = Path(f"/run/holdwarden-node-{link.netns}")
        self.pod_netns: set[str] = set()
        self.container_ids: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._marker.write_text(f"{self.root}\n")
        binaries = controller_binaries(("kubelet", "kube-proxy", "coredns"))
        self._timed("containerd", self._start_containerd)
        self._timed("pause image", lambda: self.import_image(build_image(PAUSE_IMAGE)))
        self._timed("coredns", lambda: self._start_coredns(binaries["coredns"]))
        self._timed("kubelet", lambda: self._start_kubelet(binaries["kubelet"]))
        self._timed("kube-proxy", lambda: self._start_kube_proxy(binaries["kube-proxy"]))
        self._timed("node ready", self._wait_ready)

    def _timed(self, name: str, step: Any) -> None:
        began = time.monotonic()
        step()
        self.phase_seconds[name] = time.monotonic() - began

    def drain(self) -> None:
        """Stop and remove every CRI sandbox and container (before containerd stops)."""
        if not self.socket.exists():
            return
        ctr = ["ctr", f"--address={self.socket}", "-n", CRI_NAMESPACE]
        with contextlib.suppress(subprocess.TimeoutExpired, Exception):
            # The Pods' network namespaces (/run/netns/cni-*): containerd's CRI removes one
            # when the kubelet stops its sandbox, not when a task is killed here.
            for container in _run([*ctr, "containers", "ls", "-q"], check=False).split():
                self.container_ids.add(container)
                info = _run([*ctr, "containers", "info", container], check=False, timeout=15)
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    for space in json.loads(info)["Spec"]["linux"]["namespaces"]:
                        path = space.get("path", "")
                        if space.get("type") == "network" and "/netns/cni-" in path:
                            self.pod_netns.add(Path(path).name)
            tasks = _run([*ctr, "tasks", "ls", "-q"], check=False, timeout=15).split()
            for task in tasks:
                _run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], check=False, timeout=15)
            for task in tasks:
                _run([*ctr, "tasks", "delete", "-f", task], check=False, timeout=15)
            for container in _run([*ctr, "containers", "ls", "-q"], check=False).split():
                _run([*ctr, "containers", "delete", container], check=False, timeout=15)

    # -- images ------------------------------------------------------------------------

    def import_image(self, archive: Path) -> list[str]:
        """Import an image archive (OCI or Docker layout) for the kubelet; its names."""
        output = _run(
            ["ctr", f"--address={self.socket}", "-n", CRI_NAMESPACE, "images", "import",
             "--all-platforms", str(archive)],
            timeout=300,
        )  # fmt: skip
        names = re.findall(r"unpacking (\S+) ", output)
        return names or [line.split()[0] for line in output.splitlines() if line.strip()]

    def running_tasks(self) -> dict[str, int]:
        """{container id: pid} of every container whose process runs on the node now (its
        containerd task is RUNNING): what a Pod's ``containerStatuses[].containerID``
        names after ``containerd://``."""
        output = _run(["ctr", f"--address={self.socket}", "-n", CRI_NAMESPACE, "tasks",
                       "ls"], timeout=30)  # fmt: skip
        return running_tasks(output)

    def images(self) -> list[str]:
        output = _run(["ctr", f"--address={self.socket}", "-n", CRI_NAMESPACE, "images",
                       "ls", "-q"])  # fmt: skip
        return output.split()

    # -- processes ---------------------------------------------------------------------

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.root), "TMPDIR": str(self.root / "tmp")}  # fmt: skip
        (self.root / "tmp").mkdir(exist_ok=True)
        process = self.cluster._spawn(name, command, env=env, netns=self.link.netns_path)
        self.pids[name] = process.pid
        return process

    def log_tails(self, size: int = 3000) -> str:
        parts = []
        for name in ("containerd", "kubelet", "kube-proxy", "coredns"):
            log = self.cluster.workdir / f"{name}.log"
            if log.exists():
                parts.append(f"--- {name} log tail ---\n{log.read_text(errors='replace')[-size:]}")
        return "\n".join(parts)

    def _check_alive(self) -> None:
        for name, process in self.cluster._processes:
            if name in self.pids and process.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {process.returncode} during the node's "
                    f"start-up\n{self.log_tails()}"
                )

    def _wait(self, what: str, done: Any, timeout: float = _READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if done():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{what} not within {timeout:.0f}s\n{self.log_tails()}")
            time.sleep(0.2)

    def _start_containerd(self) -> None:
        ensure_host_packages()
        base = self.root / "containerd"
        cni_conf = self.root / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": "holdwarden",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (cni_conf / "10-holdwarden.conflist").write_text(json.dumps(conflist, indent=1))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE.reference}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
  Root = "{base / "runc"}"
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
"""
        base.mkdir(parents=True, exist_ok=True)
        (base / "config.toml").write_text(config)
        self._spawn("containerd", ["containerd", f"--config={base / 'config.toml'}"])

        def serving() -> bool:
            if not self.socket.exists():
                return False
            result = subprocess.run(
                ["ctr", f"--address={self.socket}", "version"],
                capture_output=True,
                timeout=10,
                check=False,
            )
            return result.returncode == 0

        self._wait("containerd answering on its socket", serving, timeout=60)

    def _start_kubelet(self, kubelet: Path) -> None:
        cluster = self.cluster
        work = self.root / "kubelet"
        kubeconfig = _client_kubeconfig(
            cluster, f"system:node:{self.name}", ["system:nodes"], work / "identity"
        )
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 here: kubelet 1.36 refuses it unless told (and says v1 goes away).
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            # No /kubepods hierarchy shared with another run's kubelet on this machine.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.link.node,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(cluster.workdir / "ca.crt")},
            },
            # Only the apiserver (the admin certificate, of this run's CA) calls it.
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(work / "volume-plugins"),
            "resolvConf": "/etc/resolv.conf",
            # The run's CoreDNS, in the node's namespace on its end of the link.
            "clusterDNS": [self.link.node],
            "clusterDomain": CLUSTER_DOMAIN,
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {"memory.available": "1%"},
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "serializeImagePulls": False,
            "localStorageCapacityIsolation": False,
        }
        if cluster.node_count:
            # Beside kwok nodes the node lifecycle runs with the rig's short grace
            # (controllers.NODE_LIFECYCLE_FLAGS): renew the Lease as often as kwok does
            # (every 2.5 s, not the default 10 s), so a busy machine does not take this
            # node for lost.
            config["nodeLeaseDurationSeconds"] = NODE_LEASE_SECONDS
        work.mkdir(parents=True, exist_ok=True)
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "kubelet",
            [
                str(kubelet),
                f"--config={work / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={work / 'root'}",
                f"--cert-dir={work / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.link.node}",
                "--v=1",
            ],
        )

    def _start_coredns(self, coredns: Path) -> None:
        """CoreDNS answering for the cluster domain from the apiserver, as its own user
        with the read access CoreDNS's kubernetes plugin needs (bound here). Other names
        are refused: nothing upstream is reachable from the node."""
        work = self.root / "coredns"
        with self.cluster.api_client() as api:
            rbac = k8s.RbacAuthorizationV1Api(api)
            role: Any = {
                "metadata": {"name": COREDNS_USER},
                "rules": [
                    {"apiGroups": [""], "resources": ["services", "pods", "namespaces"],
                     "verbs": ["list", "watch"]},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                     "verbs": ["list", "watch"]},
                ],
            }  # fmt: skip
            binding: Any = {
                "metadata": {"name": COREDNS_USER},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": COREDNS_USER},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": COREDNS_USER}],
            }  # fmt: skip
            rbac.create_cluster_role(role)
            rbac.create_cluster_role_binding(binding)
        kubeconfig = _client_kubeconfig(self.cluster, COREDNS_USER, [], work)
        address = self.link.node
        corefile = f"""{CLUSTER_DOMAIN}:{DNS_PORT} in-addr.arpa:{DNS_PORT} {{
    bind {address}
    errors
    ready {address}:{DNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""
        (work / "Corefile").write_text(corefile)
        self._spawn("coredns", [str(coredns), "-conf", str(work / "Corefile")])

    def _start_kube_proxy(self, kube_proxy: Path) -> None:
        work = self.root / "kube-proxy"
        kubeconfig = _client_kubeconfig(self.cluster, "system:kube-proxy", [], work)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": self.name,
            "clusterCIDR": POD_SUBNET,
            "healthzBindAddress": f"{self.link.node}:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Leave the machine's conntrack settings alone (some are not per namespace).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(kube_proxy), f"--config={work / 'config.yaml'}", "--v=1"])

    def _wait_ready(self) -> None:
        def ready() -> bool:
            with self.cluster.api_client() as api:
                try:
                    node: Any = api.sanitize_for_serialization(
                        k8s.CoreV1Api(api).read_node(self.name)
                    )
                except k8s.ApiException as exc:
                    if exc.status == 404:
                        return False
                    raise
            return node_ready(node)

        self._wait(f"node {self.name} Ready and schedulable", ready)

        def proxy_synced() -> bool:
            url = f"http://{self.link.node}:10256/healthz"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        self._wait("kube-proxy's rules synced (healthz 200)", proxy_synced)

        def dns_ready() -> bool:
            # 200 once the kubernetes plugin has synced its Services and EndpointSlices.
            url = f"http://{self.link.node}:{DNS_READY_PORT}/ready"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        self._wait("CoreDNS ready (its kubernetes plugin synced)", dns_ready)

    # -- measurements ------------------------------------------------------------------

    def rss_kib(self) -> dict[str, int]:
        """Current RSS (KiB) of containerd, kubelet, kube-proxy, this run's shims and its
        containers' first processes."""
        out: dict[str, int] = {}
        pids = dict(self.pids)
        shims = [p for p in _processes_naming(str(self.socket)) if p not in self.pids.values()]
        for index, pid in enumerate(shims):
            pids[f"containerd-shim {index}"] = pid
        # Each container's first process (the sandbox's pause, the Pods' programs).
        for index, pid in enumerate(sorted(_runc_leftovers(self.root)[0])):
            pids[f"container {index}"] = pid
        for name, pid in pids.items():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1])
        return out
