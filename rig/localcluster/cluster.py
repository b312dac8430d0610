"""A real, local Kubernetes control plane: etcd and kube-apiserver on loopback.

Used by the tests (a session fixture) and by ``holdwarden demo``. Nothing here imitates
the API server: it runs the real binaries (see ``binaries.py``), with RBAC authorization,
client-certificate authentication for an admin, a service-account signing key, and the
real upstream CRDs when they are available.

Invariants:
- ``start()`` either returns with the API server ready and every CRD Established, or
  raises ``ControlPlaneError`` with the server's own log tail; it never leaves a process
  behind.
- A killed owner (``kill -9``, a CI time limit, Ctrl-C) leaves nothing behind either: the
  children get SIGKILL from the kernel (PR_SET_PDEATHSIG) and from a reaper process
  (``reaper.py``), which also removes the working directory in ``/dev/shm``.
- ``stop()`` ends both processes and removes the working directory; it is idempotent.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client as k8s

from holdwarden.certs.generate import KeyPair, generate_ca, generate_client, generate_serving
from rig.builders import DEFAULT_RUNTIME
from rig.localcluster.binaries import Binaries, cache_dir, ensure_binaries, selected_cell
from rig.localcluster.crds import CRD_FILES, REFUSED_CRDS
from rig.localcluster.errors import ControlPlaneError
from rig.localcluster.ports import free_port
from rig.localcluster.rbac import IDENTITY_RBAC
from rig.localcluster.reaper import OWNER_FILE, STALE_PREFIX, Reaper, sweep_stale

if TYPE_CHECKING:
    from rig.localcluster.controllers import RealControllers
    from rig.localcluster.nodes import Nodes
    from rig.localcluster.realnode import Link, RealNode

# With nodes: how long a pod tolerates its node being not-ready or unreachable before the
# taint-eviction controller deletes it (DefaultTolerationSeconds; production: 300 s).
NODE_TOLERATION_SECONDS = 5

REQUEST_TIMEOUT = timedelta(seconds=60)
_READY_TIMEOUT_S = 60.0


def kubeconfig_document(
    server_url: str,
    user_name: str,
    credentials: dict[str, str],
    *,
    ca_path: Path | None = None,
    ca_pem: bytes | None = None,
    cluster_name: str = "local",
) -> dict[str, Any]:
    """A kubeconfig of one cluster, one user and the context joining them, current. The CA
    is a file (``ca_path``) or, for a kubeconfig that travels (a Secret), inline (``ca_pem``).
    ``credentials`` is the user's entry: client-certificate and client-key, or token."""
    if (ca_path is None) == (ca_pem is None):
        raise ValueError("kubeconfig_document: give exactly one of ca_path and ca_pem")
    cluster: dict[str, str] = {"server": server_url}
    if ca_path is not None:
        cluster["certificate-authority"] = str(ca_path)
    else:
        assert ca_pem is not None
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    context = {"cluster": cluster_name, "user": user_name}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "users": [{"name": user_name, "user": dict(credentials)}],
        "contexts": [{"name": cluster_name, "context": context}],
        "current-context": cluster_name,
    }


def write_kubeconfig(path: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` to ``path``, readable by its owner only (it holds credentials)."""
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def find_crd_dir() -> tuple[Path, str]:
    """The upstream CRDs when present (CI has them), else the project's minimal ones.

    Order: ``$HOLDWARDEN_CRDS``; ``../shared/crds`` beside the repository; the project's
    own ``tests/support/crds``. Returns the folder and which kind it is ("upstream"/"minimal").
    """
    repo = Path(__file__).resolve().parents[2]
    candidates: list[tuple[Path, str]] = []
    if os.environ.get("HOLDWARDEN_CRDS"):
        candidates.append((Path(os.environ["HOLDWARDEN_CRDS"]), "configured"))
    for root in (repo, Path.cwd()):
        candidates.append((root.parent / "shared" / "crds", "upstream"))
    for root in (repo, Path.cwd()):
        candidates.append((root / "tests" / "support" / "crds", "minimal"))
    for folder, kind in candidates:
        if all((folder / name).is_file() for name in CRD_FILES):
            return folder, kind
    raise ControlPlaneError(
        "no CRDs found: expected the CRD files in $HOLDWARDEN_CRDS, ../shared/crds or "
        f"tests/support/crds (looked in {', '.join(str(c[0]) for c in candidates)})"
    )


def accepted_crd_dir(crd_dir: Path, refused: Mapping[str, str], version: str) -> Path:
    """A folder in the cache with ``crd_dir``'s CRD files, except that each one in
    ``refused`` is the project's minimal CRD (tests/support/crds) instead."""
    minimal = Path(__file__).resolve().parents[2] / "tests" / "support" / "crds"
    digest = hashlib.sha256(str(crd_dir.resolve()).encode())
    target = cache_dir() / f"crds-accepted-{version}-{digest.hexdigest()[:12]}"
    target.mkdir(parents=True, exist_ok=True)
    for name in CRD_FILES:
        partial = target / f"{name}.partial"
        shutil.copyfile((minimal if name in refused else crd_dir) / name, partial)
        partial.replace(target / name)  # never a half-written file where a run reads it
    return target


def _die_with_parent(netns: Path | None = None) -> None:
    # PR_SET_PDEATHSIG = 1: the kernel signals the child when the parent dies. SIGKILL, not
    # SIGTERM: etcd and kube-apiserver get it at the same moment, and a SIGTERMed apiserver
    # starts a graceful shutdown that waits for the dead etcd and never ends. Test data
    # wants no graceful shutdown.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    os.setpgrp()
    if netns is not None:
        from rig.localcluster.realnode import enter_netns

        enter_netns(netns)


class LocalCluster:
    """etcd + kube-apiserver on 127.0.0.1 with the CRDs installed and test identities bound."""

    def __init__(
        self,
        workdir: Path | None = None,
        crd_dir: Path | None = None,
        binaries: Binaries | None = None,
        controllers: Sequence[str] = (),
        nodes: int = 0,
        kueue_settings: Mapping[str, Any] | None = None,
        pods: bool = False,
    ) -> None:
        if pods and "kube-controller-manager" not in controllers:
            # A real node needs the ordinary controllers (service-account tokens, the
            # root CA's ConfigMap, the node lifecycle that lifts the not-ready taint).
            controllers = ("kube-controller-manager", *controllers)
        # A real node (rig/localcluster/realnode.py): containerd, kubelet, kube-proxy and
        # kube-scheduler; Pods really run. With nodes= too, the kwok nodes run beside it:
        # one scheduler and one node lifecycle (the kwok timings) for all of them.
        self.pods = pods
        self.node: RealNode | None = None
        self._link: Link | None = None
        if nodes and "kube-controller-manager" not in controllers:
            # Only its node-lifecycle controller lifts the not-ready taint every new node
            # gets: without it nothing is ever scheduled.
            raise ValueError("nodes need the kube-controller-manager among the controllers")
        if nodes < 0:
            raise ValueError(f"nodes must be 0 or more, not {nodes}")
        self.node_count = nodes
        self.nodes: Nodes | None = None
        self._requested_workdir = workdir
        # Real controllers to run after start-up (rig/localcluster/controllers.py).
        self._controller_names = tuple(controllers)
        # Keys of Kueue's Configuration set on top of the rig's (e.g. manageJobsWithoutQueueName
        # and managedJobsNamespaceSelector): a cluster configured as a platform team runs it.
        self.kueue_settings: dict[str, Any] = dict(kueue_settings or {})
        self.controllers: RealControllers | None = None
        self._crd_dir = crd_dir
        self._binaries = binaries
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._reaper: Reaper | None = None
        self.crd_kind = ""
        self.server_url = ""
        self.request_timeout = REQUEST_TIMEOUT
        self.startup_seconds = 0.0
        self.server_version = ""
        self._binary_source = ""
        self.phase_seconds: dict[str, float] = {}
        self.ca: KeyPair | None = None

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the local control plane is not started")
        return self._workdir

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    def embedded_kubeconfig(self, path: Path) -> Path:
        """Write to ``path`` the admin's kubeconfig with every certificate and key embedded
        (``*-data``), as a kubeconfig that travels is: it names no other file."""
        work = self.workdir

        def data(name: str) -> str:
            return base64.b64encode((work / name).read_bytes()).decode()

        credentials = {
            "client-certificate-data": data("admin.crt"),
            "client-key-data": data("admin.key"),
        }
        document = kubeconfig_document(
            self.server_url, "admin", credentials, ca_pem=(work / "ca.crt").read_bytes()
        )
        return write_kubeconfig(path, document)

    def user_kubeconfig(self, path: Path, user_name: str, credentials: dict[str, str]) -> Path:
        """Write to ``path`` a kubeconfig for this apiserver as ``user_name`` with
        ``credentials`` (client certificate and key files, or a token)."""
        document = kubeconfig_document(
            self.server_url, user_name, credentials, ca_path=self.workdir / "ca.crt"
        )
        return write_kubeconfig(path, document)

    def start(self) -> None:
        started = time.monotonic()
        binaries = self._binaries or ensure_binaries()
        self._binary_source = binaries.source
        crd_dir, self.crd_kind = (self._crd_dir, "configured") if self._crd_dir else find_crd_dir()
        if self._controller_names and self.crd_kind == "minimal":
            # The real controllers need the real schemas (their defaults above all: Trainer's
            # webhook refuses a runtime whose replicas the minimal CRD left at 0). Without
            # ../shared, take the same files from the controllers' own Go modules.
            from rig.localcluster.controllers import upstream_crd_dir

            crd_dir, self.crd_kind = upstream_crd_dir(), "upstream (Go modules)"
        if self.pods:
            # Before the stale working directories go: a dead run's node is reaped from
            # what its directory still holds (runc's state: which containers to kill).
            from rig.localcluster.realnode import sweep_stale_nodes

            sweep_stale_nodes()
        cell = selected_cell()
        if self.crd_kind == "upstream" and not cell.default_controllers:
            # ../shared/crds are today's Kueue's and Trainer's: another cell takes the
            # CRDs of its own versions from their Go modules.
            from rig.localcluster.controllers import upstream_crd_dir

            crd_dir = upstream_crd_dir()
            self.crd_kind = f"upstream (Go modules, Kueue {cell.kueue}, Trainer {cell.trainer})"
        refused = REFUSED_CRDS.get(cell.kubernetes, {})
        if refused and self.crd_kind != "minimal":
            crd_dir = accepted_crd_dir(crd_dir, refused, cell.kubernetes)
            self.crd_kind += (
                f"; minimal {', '.join(sorted(refused))} (refused by kube-apiserver "
                f"{cell.kubernetes})"
            )
        if self._requested_workdir is not None:
            self._workdir = self._requested_workdir
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            # /dev/shm keeps etcd's writes off the disk: faster, and nothing to clean up
            # after a crash survives a reboot.
            shm = Path("/dev/shm")
            parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
            if parent is not None:
                sweep_stale(parent)  # left by a run whose reaper was killed too
            self._workdir = Path(tempfile.mkdtemp(prefix=STALE_PREFIX, dir=parent))
            self._owns_workdir = True
            (self._workdir / OWNER_FILE).write_text(f"{os.getpid()}\n")
        self._reaper = Reaper(self._workdir, remove_dir=self._owns_workdir)
        try:
            if self.pods:
                self._phase("node network", self._create_link)
            self._phase("credentials", self._write_credentials)
            self._phase("etcd", lambda: self._start_etcd(binaries.etcd))
            self._phase("apiserver", lambda: self._start_apiserver(binaries.kube_apiserver))
            self._phase("ready", self._wait_ready)
            self._phase("crds", lambda: self._install_crds(crd_dir))
            self._phase("rbac", self._install_rbac)
            if "trainer" not in self._controller_names:
                self._phase("runtime", self._install_runtime)
            if self._controller_names:
                self._phase("controllers", self._start_controllers)
            if self.node_count:
                self._phase("nodes", self._start_nodes)
            if self.pods:
                self._phase("real node", self._start_real_node)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _phase(self, name: str, step: Callable[[], None]) -> None:
        began = time.monotonic()
        step()
        self.phase_seconds[name] = time.monotonic() - began

    def stop(self) -> None:
        if self.node is not None:
            # Containers first, through containerd, while it still runs.
            self.node.drain()
        for _name, process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        # Test data needs no graceful shutdown; a short grace keeps teardown fast.
        deadline = time.monotonic() + 3
        for _name, process in reversed(self._processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        if self._link is not None:
            # The node's leftovers: containers, shims, mounts, network namespaces, link.
            from rig.localcluster.realnode import reap_node

            pod_netns = self.node.pod_netns if self.node is not None else set()
            ids = self.node.container_ids if self.node is not None else set()
            if self._workdir is not None:
                reap_node(
                    self._workdir / "node", self._link.netns, self._link.host_if, pod_netns, ids
                )
            self._link = None
        self.node = None
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        if self._reaper is not None:
            self._reaper.dismiss()
            self._reaper = None

    # -- clients -------------------------------------------------------------------

    def configuration(self) -> k8s.Configuration:
        """A client configuration for the admin (client certificate, O=system:masters)."""
        configuration = k8s.Configuration()
        configuration.host = self.server_url
        configuration.ssl_ca_cert = str(self.workdir / "ca.crt")
        configuration.cert_file = str(self.workdir / "admin.crt")
        configuration.key_file = str(self.workdir / "admin.key")
        configuration.verify_ssl = True
        return configuration

    def api_client(self, user: str | None = None, groups: Sequence[str] = ()) -> k8s.ApiClient:
        """An API client for the admin, or impersonating ``user`` when one is given.

        The API server adds ``system:authenticated`` and, for a service-account user name,
        the service-account groups itself. Only one extra group can be impersonated,
        since the client keeps one value per default header.
        """
        api = k8s.ApiClient(self.configuration())
        if user is not None:
            api.default_headers["Impersonate-User"] = user
            if len(groups) > 1:
                raise ValueError("api_client can impersonate at most one extra group")
            for group in groups:
                api.default_headers["Impersonate-Group"] = group
        return api

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create a namespace with a ``default`` ServiceAccount (no controller makes it)."""
        with self.api_client() as api:
            core = k8s.CoreV1Api(api)
            core.create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels or {}))
            )
            try:
                core.create_namespaced_service_account(
                    name, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
                )
            except k8s.ApiException as exc:
                # With kube-controller-manager's ordinary controllers (pods=True), its
                # service-account controller may have made it first.
                if exc.status != 409:
                    raise
        return name

    # -- internals -------------------------------------------------------------------

    def rss_kib(self) -> dict[str, int]:
        """Current RSS (KiB) of every process this cluster started, by name, and with a
        real node its containerd shims."""
        out: dict[str, int] = {}
        for name, process in self._processes:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[name] = int(line.split()[1])
        if self.node is not None:
            out.update({k: v for k, v in self.node.rss_kib().items() if k not in out})
        return out

    def import_image(self, archive: Path) -> list[str]:
        """Import an image archive (OCI or Docker layout, e.g. from ``buildah push
        oci-archive:`` or ``docker save``) into the real node's containerd, where the
        kubelet finds it (use ``imagePullPolicy: Never`` or ``IfNotPresent``): its names."""
        if self.node is None:
            raise ControlPlaneError("import_image needs a real node: LocalCluster(pods=True)")
        return self.node.import_image(archive)

    def _create_link(self) -> None:
        from rig.localcluster.realnode import create_link

        self._link = create_link()
        if self._reaper is not None:
            self._reaper.announce_node(self._link.netns, self._link.host_if, self.workdir / "node")

    def _start_real_node(self) -> None:
        from rig.localcluster.nodes import start_scheduler
        from rig.localcluster.realnode import RealNode

        assert self._link is not None
        if self.nodes is None:
            # With kwok nodes, their phase started the one scheduler all nodes share.
            start_scheduler(self)
        self.node = RealNode(self, self._link)
        self.node.start()

    @property
    def listen_address(self) -> str:
        """Where the apiserver listens: 127.0.0.1, or with a real node the host's end of
        the node's link (a Pod cannot reach the host's loopback)."""
        return self._link.host if self._link is not None else "127.0.0.1"

    def _write_credentials(self) -> None:
        work = self.workdir
        self.ca = generate_ca(common_name="holdwarden-local-ca")
        addresses = ["127.0.0.1"]
        if self._link is not None:
            # Pods verify the apiserver at the kubernetes Service's cluster IP.
            addresses += [self._link.host, self._link.service_ip]
        serving = generate_serving(
            self.ca, "kubernetes", "default", extra_dns=["localhost"], ip_addresses=addresses
        )
        admin = generate_client(self.ca, "holdwarden-admin", organizations=["system:masters"])
        files = {
            "ca.crt": self.ca.cert_pem,
            "serving.crt": serving.cert_pem,
            "serving.key": serving.key_pem,
            "admin.crt": admin.cert_pem,
            "admin.key": admin.key_pem,
        }
        sa_key = ec.generate_private_key(ec.SECP256R1())
        files["sa.key"] = sa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        files["sa.pub"] = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for name, data in files.items():
            path = work / name
            path.write_bytes(data)
            path.chmod(0o600)

    def _start_nodes(self) -> None:
        from rig.localcluster.nodes import start_nodes

        self.nodes = start_nodes(self, self.node_count)

    def _start_controllers(self) -> None:
        from rig.localcluster.controllers import start_controllers

        self.controllers = start_controllers(self, self._controller_names)

    def _spawn(
        self,
        name: str,
        command: list[str],
        env: dict[str, str] | None = None,
        netns: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``name``, logging to ``<workdir>/<name>.log``; in the network namespace
        at ``netns`` when given (the real node's processes)."""
        log = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: _die_with_parent(netns),
        )
        log.close()
        self._processes.append((name, process))
        if self._reaper is not None:
            self._reaper.announce(process.pid)
        return process

    def _start_etcd(self, etcd: Path) -> None:
        client_port, peer_port = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(etcd),
                "--name=holdwarden",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=holdwarden={peer_url}",
                # The upstream Workload CRD is about 1.4 MB; the default 1.5 MiB request
                # limit leaves too little room once it is stored with its status.
                "--max-request-bytes=10485760",
                "--quota-backend-bytes=4294967296",
                # Test data: durability across power loss is not wanted, speed is.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self, kube_apiserver: Path) -> None:
        port = free_port()
        address = self.listen_address
        self.server_url = f"https://{address}:{port}"
        work = self.workdir
        node_flags = []
        if self.pods:
            node_flags = [
                # The apiserver calls the kubelet (logs, exec) at the node's InternalIP,
                # as the admin (the kubelet trusts this run's CA).
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={work / 'admin.crt'}",
                f"--kubelet-client-key={work / 'admin.key'}",
            ]
        self._spawn(
            "kube-apiserver",
            [
                str(kube_apiserver),
                f"--etcd-servers={self._etcd_url}",
                f"--bind-address={address}",
                f"--advertise-address={address}",
                f"--secure-port={port}",
                f"--cert-dir={work / 'apiserver-certs'}",
                f"--tls-cert-file={work / 'serving.crt'}",
                f"--tls-private-key-file={work / 'serving.key'}",
                f"--client-ca-file={work / 'ca.crt'}",
                # With a real node, the kubelet is authorized by the node authorizer.
                "--authorization-mode=Node,RBAC" if self.pods else "--authorization-mode=RBAC",
                f"--service-account-key-file={work / 'sa.pub'}",
                f"--service-account-signing-key-file={work / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range="
                + (self._link.services if self._link is not None else "10.96.0.0/16"),
                "--allow-privileged=true",
                f"--request-timeout={int(self.request_timeout.total_seconds())}s",
                # Admission webhooks registered by tests live on 127.0.0.1.
                "--enable-admission-plugins=ValidatingAdmissionWebhook",
                # A loopback address cannot be an endpoint; the real node's link address
                # can, and kube-proxy carries Pods to it through the kubernetes Service.
                "--endpoint-reconciler-type=lease"
                if self.pods
                else "--endpoint-reconciler-type=none",
                *(
                    [
                        f"--default-not-ready-toleration-seconds={NODE_TOLERATION_SECONDS}",
                        f"--default-unreachable-toleration-seconds={NODE_TOLERATION_SECONDS}",
                    ]
                    if self.node_count
                    else []
                ),
                *node_flags,
                "--v=1",
            ],
        )

    def _process_logs(self) -> str:
        parts = []
        for name, process in self._processes:
            log = self.workdir / f"{name}.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            parts.append(f"--- {name} (exit code {process.poll()}) ---\n{tail}")
        return "\n".join(parts)

    def _check_version(self, context: ssl.SSLContext) -> None:
        """Record the server's version; from the cache it must be the selected cell's, so a
        cell of the version matrix cannot pass on another kube-apiserver."""
        with urllib.request.urlopen(
            f"{self.server_url}/version", context=context, timeout=10
        ) as response:
            self.server_version = str(json.loads(response.read())["gitVersion"])
        wanted = selected_cell().kubernetes
        if self._binary_source.startswith("cache") and self.server_version != wanted:
            raise ControlPlaneError(
                f"kube-apiserver from the cache reports {self.server_version}, not the "
                f"selected {wanted}"
            )

    def _wait_ready(self) -> None:
        context = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
        context.load_cert_chain(str(self.workdir / "admin.crt"), str(self.workdir / "admin.key"))
        deadline = time.monotonic() + _READY_TIMEOUT_S
        last_error = ""
        while time.monotonic() < deadline:
            for name, process in self._processes:
                if process.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {process.returncode} during start-up\n"
                        + self._process_logs()
                    )
            try:
                with urllib.request.urlopen(
                    f"{self.server_url}/readyz", context=context, timeout=2
                ) as response:
                    if response.status == 200:
                        self._write_kubeconfig()
                        self._check_version(context)
                        return
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready after {_READY_TIMEOUT_S:.0f}s ({last_error})\n"
            + self._process_logs()
        )

    def _write_kubeconfig(self) -> None:
        work = self.workdir
        credentials = {
            "client-certificate": str(work / "admin.crt"),
            "client-key": str(work / "admin.key"),
        }
        self.user_kubeconfig(self.kubeconfig_path, "admin", credentials)

    def _install_crds(self, crd_dir: Path) -> None:
        names = []
        with self.api_client() as api:
            for file_name in CRD_FILES:
                body = yaml.safe_load((crd_dir / file_name).read_text())
                names.append(body["metadata"]["name"])
                # A plain create, not a client-side apply: the upstream CRDs exceed the
                # 256 KiB last-applied annotation limit. Raw JSON both ways, so the client's
                # models need not validate and round-trip a 1.4 MB schema.
                self._raw(
                    api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body
                )
            deadline = time.monotonic() + 30
            pending = set(names)
            while pending and time.monotonic() < deadline:
                for name in sorted(pending):
                    crd = self._raw(
                        api,
                        "GET",
                        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                    )
                    conditions = (crd.get("status") or {}).get("conditions") or []
                    if any(
                        c.get("type") == "Established" and c.get("status") == "True"
                        for c in conditions
                    ):
                        pending.discard(name)
                time.sleep(0.1)
            if pending:
                raise ControlPlaneError(f"CRDs not Established after 30s: {sorted(pending)}")
            # Discovery and the CRD handler catch up a moment after Established.
            self._wait_served(api)

    def _install_runtime(self) -> None:
        """The ClusterTrainingRuntime the TrainJobs name (``DEFAULT_RUNTIME``), where no real
        Trainer installs its own: Trainer refuses every update of a TrainJob whose runtime is
        gone, and a Kueue-mode Release checks that it exists (docs/explanation/traps.md)."""
        body = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": DEFAULT_RUNTIME},
            "spec": {"template": {"spec": {"replicatedJobs": []}}},
        }
        with self.api_client() as api:
            self._raw(
                api, "POST", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", body
            )

    def _raw(self, api: k8s.ApiClient, method: str, path: str, body: Any = None) -> Any:
        response = api.call_api(
            method,
            self.server_url + path,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
        )
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise ControlPlaneError(f"{method} {path} answered {response.status}: {data[:2000]!r}")
        return json.loads(data)

    def _wait_served(self, api: k8s.ApiClient) -> None:
        deadline = time.monotonic() + 20
        custom = k8s.CustomObjectsApi(api)
        while True:
            try:
                custom.list_cluster_custom_object("trainer.kubeflow.org", "v1alpha1", "trainjobs")
                custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "workloads")
                return
            except k8s.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _install_rbac(self) -> None:
        with self.api_client() as api:
            rbac = k8s.RbacAuthorizationV1Api(api)
            for identity in IDENTITY_RBAC:
                role_name = f"holdwarden-test:{identity.short_name}"
                rbac.create_cluster_role(
                    k8s.V1ClusterRole(
                        metadata=k8s.V1ObjectMeta(name=role_name),
                        rules=[
                            k8s.V1PolicyRule(
                                api_groups=list(rule.api_groups),
                                resources=list(rule.resources),
                                verbs=list(rule.verbs),
                            )
                            for rule in identity.rules
                        ],
                    )
                )
                rbac.create_cluster_role_binding(
                    k8s.V1ClusterRoleBinding(
                        metadata=k8s.V1ObjectMeta(name=role_name),
                        role_ref=k8s.V1RoleRef(
                            api_group="rbac.authorization.k8s.io",
                            kind="ClusterRole",
                            name=role_name,
                        ),
                        subjects=[
                            k8s.RbacV1Subject(
                                kind="User",
                                name=identity.user,
                                api_group="rbac.authorization.k8s.io",
                            )
                        ],
                    )
                )


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(**kwargs)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
