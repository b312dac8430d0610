"""Nodes for the local control plane: the real kube-scheduler, and kwok playing kubelets.

``LocalCluster(nodes=N)`` runs, after the controllers:

- **kube-scheduler** v1.36.3 as ``system:kube-scheduler`` (a client certificate; the
  apiserver's bootstrap RBAC binds it), so pods are bound to nodes by the real scheduler.
- **One kwok v0.8.0 process per node**, each managing only its own node (label
  ``NODE_LABEL=<name>``). kwok is the node's kubelet: it keeps the node Ready and renews
  its Lease in ``kube-node-lease`` every 2.5 s (``--node-lease-duration-seconds=10``),
  turns the pods bound to it ``Running``, and confirms their deletion once they have a
  deletionTimestamp (the kubelet's part of graceful termination). Its stages are kwok's
  own, read from its module: node-initialize, node-heartbeat-with-lease, pod-ready and
  pod-delete. Not pod-complete: a training pod runs until it is stopped.
- kube-controller-manager (controllers.py) then also runs the node-lifecycle,
  taint-eviction and pod-GC controllers with test timings (docs/testing.md).

Beside a real node (``LocalCluster(pods=True, nodes=N)``, realnode.py) nothing changes
for either: each kwok manages only the node carrying its label (the real node carries
none), its pods' IPs come from ``10.244.<i+1>.0/24``, never the real node's Pod subnet,
and the one scheduler and node lifecycle serve every node, the real kubelet renewing its
Lease as often as kwok does.

So losing a node is what it is in a cluster: ``lose(name)`` kills that node's kwok (its
kubelet dies: no heartbeat, no Lease renewal, nothing confirms a pod's termination); the
real node-lifecycle controller marks it unreachable and taints it. ``restore(name)``
starts its kwok again; ``delete(name)`` deletes the Node object (pod GC then
force-deletes its pods).

Invariants: ``start_nodes`` returns only when every node is Ready and schedulable (no
``not-ready``/``unreachable`` taint), or raises ``ControlPlaneError`` with the kwok and
scheduler logs; every process is started through ``LocalCluster._spawn``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client as k8s

from holdwarden.certs.generate import generate_client
from rig.localcluster.binaries import components, controller_binaries
from rig.localcluster.controllers import module_root
from rig.localcluster.errors import ControlPlaneError

if TYPE_CHECKING:
    import subprocess

    from rig.localcluster.cluster import LocalCluster

NODE_LABEL = "holdwarden.io/kwok-node"
"""Which kwok process plays a node (its value is the node's name)."""
KWOK_IDENTITY = "holdwarden:kwok"
SCHEDULER_IDENTITY = "system:kube-scheduler"
NODE_LEASE_SECONDS = 10
"""kwok renews each node's Lease every quarter of this (2.5 s)."""
_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
_READY_TIMEOUT_S = 120.0
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
_UNSCHEDULABLE_TAINTS = ("node.kubernetes.io/not-ready", UNREACHABLE_TAINT)


def ready_status(node: Any) -> str | None:
    """The status of the node's Ready condition ("True", "False", "Unknown"), or None."""
    status = (node.get("status") or {}) if isinstance(node, dict) else {}
    for entry in status.get("conditions") or []:
        if entry.get("type") == "Ready":
            return str(entry.get("status"))
    return None


def unreachable_taint(node: Any, effect: str) -> bool:
    """The node carries the node-lifecycle controller's ``unreachable`` taint ``effect``."""
    spec = (node.get("spec") or {}) if isinstance(node, dict) else {}
    return any(
        t.get("key") == UNREACHABLE_TAINT and t.get("effect") == effect
        for t in spec.get("taints") or []
    )


def node_ready(node: Any) -> bool:
    """The node's Ready condition is True and it carries no taint that keeps pods off."""
    status = (node.get("status") or {}) if isinstance(node, dict) else {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    taints = {t.get("key") for t in ((node.get("spec") or {}).get("taints") or [])}
    return ready and not taints & set(_UNSCHEDULABLE_TAINTS)


@dataclass
class Nodes:
    """The cluster's kwok nodes, and the means to lose, restore and delete one."""

    cluster: LocalCluster
    names: tuple[str, ...]
    kwok: Path
    kubeconfig: Path
    stages: tuple[Path, ...]
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _starts: dict[str, int] = field(default_factory=dict)

    def _start_kwok(self, name: str) -> None:
        count = self._starts.get(name, 0) + 1
        self._starts[name] = count
        command = [
            str(self.kwok),
            f"--kubeconfig={self.kubeconfig}",
            f"--manage-nodes-with-label-selector={NODE_LABEL}={name}",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            *[f"--config={stage}" for stage in self.stages],
        ]
        # KWOK_WORKDIR: kwok always loads <workdir>/kwok.yaml first; keep it ours.
        work = self.cluster.workdir / "kwok" / name
        work.mkdir(parents=True, exist_ok=True)
        env = {"KWOK_WORKDIR": str(work), "PATH": "/usr/bin:/bin", "HOME": str(work)}
        self._processes[name] = self.cluster._spawn(f"kwok-{name}-{count}", command, env=env)

    def lose(self, name: str) -> None:
        """The node's kubelet dies: its kwok is killed (no heartbeat, no confirmation)."""
        process = self._processes.pop(name)
        process.kill()
        process.wait(timeout=10)

    def lost(self) -> list[str]:
        """The nodes whose kubelet is dead and whose Node object still exists."""
        return [n for n in self.names if n not in self._processes and self.get(n) is not None]

    def restore(self, name: str) -> None:
        """The node's kubelet comes back (a new kwok process for it)."""
        if name in self._processes:
            raise ValueError(f"node {name} is not lost")
        self._start_kwok(name)

    def delete(self, name: str) -> None:
        """Delete the Node object (what an operator or a cloud controller does for a
        machine that is gone)."""
        with self.cluster.api_client() as api:
            k8s.CoreV1Api(api).delete_node(name)

    def get(self, name: str) -> dict[str, Any] | None:
        with self.cluster.api_client() as api:
            try:
                found: Any = api.sanitize_for_serialization(k8s.CoreV1Api(api).read_node(name))
            except k8s.ApiException as exc:
                if exc.status == 404:
                    return None
                raise
        return dict(found)

    def lifecycle_evidence(self, lost: str) -> str:
        """Every node's Ready status, last heartbeat and taints, its Lease's last renewal,
        and the node-lifecycle controller's recent lines: why a taint did or did not come."""
        lines = [f"lost: {lost}"]
        with self.cluster.api_client() as api:
            leases = k8s.CoordinationV1Api(api)
            for name in self.names:
                node = self.get(name)
                if node is None:
                    lines.append(f"{name}: deleted")
                    continue
                ready: dict[str, Any] = next(
                    (c for c in (node.get("status") or {}).get("conditions") or []
                     if c.get("type") == "Ready"),
                    {},
                )  # fmt: skip
                try:
                    lease: Any = leases.read_namespaced_lease(name, "kube-node-lease")
                    renewed = lease.spec.renew_time
                except k8s.ApiException as exc:
                    renewed = f"no Lease ({exc.status})"
                taints = [(t.get("key"), t.get("effect")) for t in
                          (node.get("spec") or {}).get("taints") or []]  # fmt: skip
                kubelet = "up" if name in self._processes else "dead"
                lines.append(
                    f"{name}: Ready={ready.get('status')} "
                    f"heartbeat={ready.get('lastHeartbeatTime')} lease renewed={renewed} "
                    f"kubelet={kubelet} taints={taints}"
                )
        log_path = self.cluster.workdir / "kube-controller-manager.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        said = [
            line for line in log.splitlines()
            if ("node_lifecycle" in line or "taint" in line.lower() or "isruption" in line)
            and "hasn't been updated" not in line  # once a second per condition: noise
        ]  # fmt: skip
        return "\n".join([*lines, "--- node lifecycle controller ---", *said[-60:]])

    def rss_kib(self) -> dict[str, int]:
        """Current RSS of each running kwok, in KiB."""
        out: dict[str, int] = {}
        for name, process in self._processes.items():
            try:
                for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1])
            except OSError:
                continue
        return out


def _client_kubeconfig(cluster: LocalCluster, user: str, folder: Path) -> Path:
    assert cluster.ca is not None
    pair = generate_client(cluster.ca, user)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "client.crt").write_bytes(pair.cert_pem)
    (folder / "client.key").write_bytes(pair.key_pem)
    (folder / "client.key").chmod(0o600)
    credentials = {
        "client-certificate": str(folder / "client.crt"),
        "client-key": str(folder / "client.key"),
    }
    return cluster.user_kubeconfig(folder / "kubeconfig", user, credentials)


def _bind_kwok(api: k8s.ApiClient, kwok_root: Path) -> None:
    """kwok's upstream ClusterRole (read from its module), bound to KWOK_IDENTITY."""
    (role,) = [
        d
        for d in yaml.safe_load_all((kwok_root / "kustomize" / "rbac" / "role.yaml").read_text())
        if isinstance(d, dict) and d.get("kind") == "ClusterRole"
    ]
    name = f"holdwarden-{role['metadata']['name']}"
    rbac = k8s.RbacAuthorizationV1Api(api)
    body: Any = {"metadata": {"name": name}, "rules": role["rules"]}
    rbac.create_cluster_role(body)
    binding: Any = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [
            {"kind": "User", "name": KWOK_IDENTITY, "apiGroup": "rbac.authorization.k8s.io"}
        ],
    }
    rbac.create_cluster_role_binding(binding)


def node_body(name: str, index: int) -> dict[str, Any]:
    """The Node object of kwok node ``name``, the ``index``-th: labelled for its own kwok
    only, its pod CIDR apart from every other node's and from a real node's."""
    cidr = f"10.244.{index + 1}.0/24"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {NODE_LABEL: name, "kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        # Each kwok hands out pod IPs from its node's podCIDR (else all from 10.0.0.0/24);
        # 10.244.0.0/24 is a real node's (realnode.POD_SUBNET, kube-proxy's clusterCIDR),
        # so no kwok pod ever takes the address of a real Pod beside it.
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
    }


def start_scheduler(cluster: LocalCluster, binary: Path | None = None) -> None:
    """The real kube-scheduler as ``system:kube-scheduler`` (bootstrap RBAC binds it)."""
    if binary is None:
        binary = controller_binaries(("kube-scheduler",))["kube-scheduler"]
    work = cluster.workdir / "nodes"
    scheduler_config = _client_kubeconfig(cluster, SCHEDULER_IDENTITY, work / "scheduler")
    cluster._spawn(
        "kube-scheduler",
        [
            str(binary),
            f"--kubeconfig={scheduler_config}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ],
    )


def start_nodes(cluster: LocalCluster, count: int) -> Nodes:
    """The scheduler and ``count`` kwok nodes (``kwok-0`` ...), all Ready; see the module."""
    binaries = controller_binaries(("kube-scheduler", "kwok"))
    kwok_root = module_root("sigs.k8s.io/kwok", components()["kwok"].version)
    stages = tuple(kwok_root / "kustomize" / "stage" / stage for stage in _STAGES)
    work = cluster.workdir / "nodes"
    start_scheduler(cluster, binaries["kube-scheduler"])
    kwok_config = _client_kubeconfig(cluster, KWOK_IDENTITY, work / "kwok")
    names = tuple(f"kwok-{i}" for i in range(count))
    with cluster.api_client() as api:
        _bind_kwok(api, kwok_root)
        core = k8s.CoreV1Api(api)
        for index, name in enumerate(names):
            node: Any = node_body(name, index)
            core.create_node(node)
    nodes = Nodes(cluster, names, binaries["kwok"], kwok_config, stages)
    for name in names:
        nodes._start_kwok(name)
    deadline = time.monotonic() + _READY_TIMEOUT_S
    pending = set(names)
    while pending:
        for name in sorted(pending):
            node = nodes.get(name)
            if node is not None and node_ready(node):
                pending.discard(name)
        if not pending:
            break
        if time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}"
                for path in sorted(cluster.workdir.glob("kwok-*.log"))
            )
            raise ControlPlaneError(
                f"nodes not Ready and schedulable after {_READY_TIMEOUT_S:.0f}s: "
                f"{sorted(pending)}\n{logs}"
            )
        time.sleep(0.25)
    return nodes
