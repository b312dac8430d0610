"""The real controllers on the local control plane: Kueue, Trainer, JobSet and the
kube-controller-manager's Job and garbage-collector controllers.

``LocalCluster(controllers=...)`` runs them after its own start-up (``start_controllers``).
Each one runs as the identity it has in a cluster, with its own admission webhooks, so the
enforcer sees the same usernames and the same writes it would see in production:

- **Identity.** Kueue, Trainer and JobSet each get their upstream ServiceAccount
  (``kueue-system:kueue-controller-manager``, ``kubeflow-system:kubeflow-trainer-controller-
  manager``, ``jobset-system:jobset-controller-manager``) and a kubeconfig holding a
  TokenRequest token for it, so the apiserver authenticates them as
  ``system:serviceaccount:<ns>:<name>``. Their RBAC is the upstream ClusterRoles and
  bindings, read at run time from the Go module cache and given the namespace and name
  prefix their kustomizations give them. kube-controller-manager authenticates as
  ``system:kube-controller-manager`` (a client certificate, as kubeadm gives it) and, with
  ``--use-service-account-credentials``, runs each controller as its own service account
  (``kube-system:job-controller``, ...), bound by the apiserver's bootstrap RBAC.
- **Webhooks.** Each controller serves its webhooks on 127.0.0.1. Their upstream
  Mutating/ValidatingWebhookConfigurations (and CRD conversion webhooks) are read from the
  module, given the upstream kustomize patches, and registered with ``clientConfig.url``
  and a ``caBundle`` instead of a Service reference (nothing routes to Services here).
- **CRDs.** Those in ``../shared/crds`` are installed by the cluster; whatever else the
  controllers' modules ship (JobSet's, Kueue's Cohorts, Topologies, ...) is created here,
  and the ClusterTrainingRuntime ``torch-distributed`` that the TrainJobs reference.
- **Certificates.** Kueue exits at start-up unless its internal certificate management is
  on (otherwise it insists on ``/etc/kueue/metrics/certs``), and that management (the
  cert-controller rotator) keeps the certificate in its Secret only if it is RSA, with a CA
  that names itself as a DNS SAN. So Kueue gets such a Secret, made here, with the same
  files written into its configured cert dir as a kubelet's Secret volume would. Trainer
  and JobSet run with internal management off and the project's own serving certificates.

Invariants:
- ``start_controllers`` returns only when every requested controller is ready (its readyz
  answers 200, or for kube-controller-manager its controllers' service accounts exist), or
  raises ``ControlPlaneError`` with the failing controller's log tail. Nothing is skipped.
- Every process is started through ``LocalCluster._spawn``, so it dies with the test
  process exactly like etcd and kube-apiserver do.
- Nothing upstream is copied into the project: manifests are read from the module cache.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s

from holdwarden.certs.generate import generate_client, generate_serving
from holdwarden.vocabulary import KUEUE_CONFIG_KEY, KUEUE_CONFIG_MAP
from rig.localcluster.binaries import cache_dir, components, controller_binaries
from rig.localcluster.crds import CRD_FILES
from rig.localcluster.errors import ControlPlaneError
from rig.localcluster.ports import free_port

if TYPE_CHECKING:
    from rig.localcluster.cluster import LocalCluster

CONTROLLERS = ("kueue", "trainer", "jobset", "kube-controller-manager")
KUEUE_NAMESPACE = "kueue-system"
TRAINER_NAMESPACE = "kubeflow-system"
JOBSET_NAMESPACE = "jobset-system"
TRAINING_RUNTIME = "torch-distributed"
_READY_TIMEOUT_S = 180.0  # Kueue on a busy 2-core machine takes tens of seconds
_TOKEN_SECONDS = 48 * 3600
_KCM_SERVICE_ACCOUNTS = ("job-controller", "generic-garbage-collector")
# With nodes (LocalCluster(nodes=N)): the controllers that decide when a node is lost and
# what becomes of its pods, and their timings: flag -> (here, production default).
NODE_LIFECYCLE_CONTROLLERS = (
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
)
NODE_LIFECYCLE_FLAGS = {
    "node-monitor-period": ("1s", "5s"),
    # 5 missed Lease renewals (kwok renews every 2.5 s): a node that merely lags under a
    # busy CI machine is not taken for lost.
    "node-monitor-grace-period": ("15s", "50s"),
    "node-startup-grace-period": ("20s", "1m0s"),
    # Not 1: after a pass that finds every node of a zone down (start-up, or all lagging
    # under load) the controller swaps in a never-accepting limiter, and swaps back only
    # if that limiter's QPS differs from the rate; client-go's never-limiter reports a QPS
    # of 1, so at exactly 1 no node is ever given a NoExecute taint again
    # (tests/real/test_node_lifecycle.py).
    "node-eviction-rate": ("2", "0.1"),
    # A zone counts as partly disrupted (and evictions stop) only when every node in it is
    # down: with five nodes, three lagging at once under load would otherwise stop the
    # taints the lost-node story waits for.
    "unhealthy-zone-threshold": ("1", "0.55"),
}


def kcm_selection(*, pods: bool, nodes: bool) -> tuple[list[str], list[str]]:
    """kube-controller-manager's ``--controllers`` and its node-lifecycle flags, for a
    cluster with a real node (``pods``), kwok nodes (``nodes``), both or neither.

    Invariants: the Job and garbage-collector controllers always run; with a real node,
    every ordinary controller does (``*``: kube-controller-manager's default set, which
    includes the three of NODE_LIFECYCLE_CONTROLLERS); with kwok nodes, those three run
    with the rig's timings (NODE_LIFECYCLE_FLAGS), a real node beside them or not, so that
    a lost node is noticed as fast whichever nodes the cluster has. A real node alone keeps
    the production timings."""
    controllers = ["*"] if pods else ["job-controller", "garbage-collector-controller"]
    if nodes and not pods:
        controllers += list(NODE_LIFECYCLE_CONTROLLERS)
    flags = (
        [f"--{flag}={value}" for flag, (value, _) in NODE_LIFECYCLE_FLAGS.items()] if nodes else []
    )
    return controllers, flags


_NAMESPACED_KINDS = {"Role", "RoleBinding", "ServiceAccount", "Secret", "ConfigMap"}
_PREFIXED_RESOURCES = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}


# -- the Go module cache (read-only upstream manifests) ---------------------------------


def upstream_crd_dir() -> Path:
    """A folder with the eight upstream CRD files the local cluster installs, copied from
    the Kueue and Trainer modules (the same bytes as ../shared/crds), in the cache."""
    sources = {
        "trainer.kubeflow.org_": module_root("github.com/kubeflow/trainer/v2",
                                             components()["trainer"].version)
        / "manifests" / "base" / "crds",
        "kueue.x-k8s.io_": module_root("sigs.k8s.io/kueue", components()["kueue"].version)
        / "config" / "components" / "crd" / "bases",
    }  # fmt: skip
    versions = "-".join(components()[name].version for name in ("kueue", "trainer"))
    target = cache_dir() / f"crds-{versions}"
    target.mkdir(parents=True, exist_ok=True)
    for name in CRD_FILES:
        (source,) = [folder for prefix, folder in sources.items() if name.startswith(prefix)]
        partial = target / f"{name}.partial"
        shutil.copyfile(source / name, partial)
        partial.replace(target / name)  # never a half-written file where a run reads it
    return target


def module_root(module: str, version: str) -> Path:
    """The folder of ``module@version`` in the Go module cache, downloaded if missing.

    Building a controller fills the cache; with prebuilt binaries
    (``HOLDWARDEN_CONTROLLER_ASSETS``) ``go mod download`` fetches the module's source,
    which is where the upstream CRDs, RBAC and webhook manifests are read from.
    """
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    folder = info.get("Dir")
    if result.returncode != 0 or not folder:
        raise ControlPlaneError(
            f"cannot read {module}@{version} from the Go module cache: "
            f"{info.get('Error') or result.stderr[-2000:]}"
        )
    return Path(folder)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


# -- a small subset of kustomize, enough for these manifests -----------------------------


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def _json_patch(doc: dict[str, Any], ops: Iterable[dict[str, Any]]) -> None:
    """RFC 6902 ``add`` and ``replace``; anything else is an error, never ignored."""
    for op in ops:
        if op.get("op") not in ("add", "replace"):
            raise ControlPlaneError(f"unsupported JSON patch operation in upstream: {op}")
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        value = copy.deepcopy(op["value"])
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op["op"] == "add":
                node.insert(index, value)
            else:
                node[index] = value
        else:
            node[last] = value


_FIELD_PATH = re.compile(r"^webhooks\.\[name=([^\]]+)\]\.(\w+)$")


def _named_webhook(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((w for w in doc.get("webhooks", []) if w.get("name") == name), None)


def _matches(doc: dict[str, Any], target: dict[str, Any]) -> bool:
    return doc.get("kind") == target.get("kind") and (
        "name" not in target or doc["metadata"]["name"] == target["name"]
    )


def _kustomize_webhooks(folder: Path) -> list[dict[str, Any]]:
    """The webhook configurations of ``folder``'s kustomization, its patches applied.

    Supported, as the three upstreams use them: JSON-patch files with a target, inline
    strategic-merge patches of named webhooks, and ``replacements`` between webhooks'
    fields. Anything else in the kustomization is an error, so that a changed upstream
    fails loudly instead of being registered half-patched.
    """
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs = [
        d
        for name in kustomization.get("resources", [])
        for d in _docs(folder / name)
        if d.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    for patch in kustomization.get("patches", []):
        if "path" in patch:
            ops = yaml.safe_load((folder / patch["path"]).read_text())
            for doc in docs:
                if _matches(doc, patch.get("target", {})):
                    _json_patch(doc, ops)
        elif "patch" in patch:
            merge = yaml.safe_load(patch["patch"])
            for doc in docs:
                if _matches(doc, {"kind": merge["kind"], "name": merge["metadata"]["name"]}):
                    for hook in merge.get("webhooks", []):
                        existing = _named_webhook(doc, hook["name"])
                        if existing is None:
                            raise ControlPlaneError(f"upstream patch names no webhook {hook}")
                        existing.update(copy.deepcopy(hook))
        else:
            raise ControlPlaneError(f"unsupported kustomize patch in {folder}: {patch}")
    for replacement in kustomization.get("replacements", []):
        source = replacement["source"]
        parsed = _FIELD_PATH.match(source["fieldPath"])
        origin = next((d for d in docs if _matches(d, source)), None)
        hook = _named_webhook(origin, parsed.group(1)) if origin and parsed else None
        if parsed is None or hook is None:
            raise ControlPlaneError(f"unsupported kustomize replacement source: {source}")
        value = hook[parsed.group(2)]
        for target in replacement["targets"]:
            for doc in docs:
                if not _matches(doc, target["select"]):
                    continue
                for path in target["fieldPaths"]:
                    wanted = _FIELD_PATH.match(path)
                    if wanted is None:
                        raise ControlPlaneError(f"unsupported kustomize field path: {path}")
                    found = _named_webhook(doc, wanted.group(1))
                    if found is not None:
                        found[wanted.group(2)] = copy.deepcopy(value)
    return docs


def _to_url(client_config: dict[str, Any], port: int, ca_pem: bytes) -> dict[str, Any]:
    """A Service-reference clientConfig rewritten to the controller on 127.0.0.1."""
    service = client_config.get("service") or {}
    path = service.get("path", "")
    return {
        "url": f"https://127.0.0.1:{port}{path}",
        "caBundle": base64.b64encode(ca_pem).decode(),
    }


def _prefixed(docs: Iterable[dict[str, Any]], prefix: str, namespace: str) -> list[dict[str, Any]]:
    """kustomize's ``namePrefix`` and ``namespace`` on RBAC objects and ServiceAccounts."""
    out = []
    for original in docs:
        doc = copy.deepcopy(original)
        meta = doc["metadata"]
        meta["name"] = prefix + meta["name"]
        if doc["kind"] in _NAMESPACED_KINDS:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if "roleRef" in doc:
            doc["roleRef"]["name"] = prefix + doc["roleRef"]["name"]
        for subject in doc.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                subject["name"] = prefix + subject["name"]
                subject["namespace"] = namespace
        # kustomize's nameReference: a rule naming an object the same kustomization renames
        # (its webhook configurations) names the renamed one.
        for rule in doc.get("rules", []):
            if set(rule.get("resources", [])) & _PREFIXED_RESOURCES and "resourceNames" in rule:
                rule["resourceNames"] = [prefix + n for n in rule["resourceNames"]]
        out.append(doc)
    return out


# -- certificates for cert-controller (Kueue) -------------------------------------------


def _rsa_key_pem(key: rsa.RSAPrivateKey) -> bytes:
    # PKCS#1 ("RSA PRIVATE KEY"): cert-controller parses the CA key with ParsePKCS1PrivateKey.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def rotator_secret(ca_name: str, organization: str, dns_name: str) -> dict[str, bytes]:
    """``ca.crt``/``ca.key``/``tls.crt``/``tls.key`` that cert-controller keeps as they are.

    It keeps a Secret whose CA verifies for the DNS name ``ca_name`` and whose serving
    certificate verifies for ``dns_name``, both valid beyond its 90-day look-ahead; the
    serving certificate also names 127.0.0.1, the address the apiserver calls.
    """
    now = datetime.now(UTC)
    start, ca_end = now - timedelta(hours=1), now + timedelta(days=3650)
    leaf_end = now + timedelta(days=365)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, ca_name),
        ]
    )
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(ca_end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(leaf_end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(dns_name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return {
        "ca.crt": ca_cert.public_bytes(pem),
        "ca.key": _rsa_key_pem(ca_key),
        "tls.crt": leaf.public_bytes(pem),
        "tls.key": _rsa_key_pem(key),
    }


# -- the controllers ---------------------------------------------------------------------


@dataclass
class Controller:
    """One running controller: its process, log, health endpoint and webhook port."""

    name: str
    identity: str
    log: Path
    pid: int = 0
    health_url: str = ""
    webhook_port: int = 0
    ready: Callable[[], bool] | None = None

    def rss_kib(self) -> tuple[int, int]:
        """(current, peak) resident set size in KiB, from /proc; (0, 0) once gone."""
        values = {"VmRSS": 0, "VmHWM": 0}
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                key, _, rest = line.partition(":")
                if key in values:
                    values[key] = int(rest.split()[0])
        except (OSError, ValueError):
            pass
        return values["VmRSS"], values["VmHWM"]

    def log_tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


@dataclass
class RealControllers:
    """The set of controllers a LocalCluster runs; ``by_name`` maps name to Controller."""

    by_name: dict[str, Controller] = field(default_factory=dict)

    def rss_kib(self) -> dict[str, tuple[int, int]]:
        return {name: c.rss_kib() for name, c in self.by_name.items()}

    def logs(self) -> dict[str, str]:
        """Each controller's whole log (for "denied the request" checks)."""
        return {
            name: c.log.read_text(errors="replace") if c.log.exists() else ""
            for name, c in self.by_name.items()
        }


class _Setup:
    """Everything ``start_controllers`` does, in order, on one LocalCluster."""

    def __init__(self, cluster: LocalCluster, names: Sequence[str]) -> None:
        unknown = sorted(set(names) - set(CONTROLLERS))
        if unknown:
            raise ControlPlaneError(f"unknown controllers {unknown}; known: {CONTROLLERS}")
        # Trainer creates JobSets and JobSet creates Jobs: a TrainJob goes nowhere without
        # the controllers after it, so the order is fixed whatever the caller's order.
        self.names = [n for n in CONTROLLERS if n in names]
        self.cluster = cluster
        self.root = cluster.workdir / "controllers"
        self.root.mkdir(exist_ok=True)
        self.api = cluster.api_client()
        self.result = RealControllers()

    # raw JSON, so that 1 MB CRDs need no round trip through the client's models
    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        response = self.api.call_api(
            method,
            self.cluster.server_url + path,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
        )
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        try:
            return response.status, json.loads(data) if data else {}
        except json.JSONDecodeError:
            return response.status, {"raw": data[:2000].decode(errors="replace")}

    def must(self, method: str, path: str, body: Any = None, ok: Sequence[int] = ()) -> Any:
        status, data = self.request(method, path, body)
        if not (200 <= status < 300 or status in ok):
            raise ControlPlaneError(f"{method} {path} answered {status}: {data}")
        return data

    def create(self, doc: dict[str, Any]) -> None:
        """Create ``doc`` (AlreadyExists is fine: the bootstrap RBAC, a second start)."""
        api_version, kind = doc["apiVersion"], doc["kind"]
        group_path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        plural = {
            "ClusterRole": "clusterroles",
            "ClusterRoleBinding": "clusterrolebindings",
            "Role": "roles",
            "RoleBinding": "rolebindings",
            "ServiceAccount": "serviceaccounts",
            "Secret": "secrets",
            "ConfigMap": "configmaps",
            "Namespace": "namespaces",
            "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
            "CustomResourceDefinition": "customresourcedefinitions",
            "ClusterTrainingRuntime": "clustertrainingruntimes",
        }[kind]
        namespace = doc["metadata"].get("namespace") if kind in _NAMESPACED_KINDS else None
        scope = f"/namespaces/{namespace}" if namespace else ""
        self.must("POST", f"{group_path}{scope}/{plural}", doc, ok=(409,))

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # -- shared steps ---------------------------------------------------------------

    def service_account(self, namespace: str, name: str) -> None:
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        self.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )

    def token_kubeconfig(self, namespace: str, account: str, name: str) -> Path:
        """A kubeconfig whose user is a TokenRequest token of ``namespace/account``."""
        core = k8s.CoreV1Api(self.api)
        status = core.create_namespaced_service_account_token(
            account,
            namespace,
            k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=_TOKEN_SECONDS)
            ),
        ).status
        if status is None or not status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{account} gave no token")
        return self.kubeconfig(name, {"token": str(status.token)})

    def kubeconfig(self, name: str, user: dict[str, str]) -> Path:
        return self.cluster.user_kubeconfig(self.root / f"{name}.kubeconfig", name, user)

    def install_crds(self, docs: Iterable[dict[str, Any]]) -> None:
        """Create the CRDs not installed yet; wait until every one is Established."""
        names = []
        for doc in docs:
            name = doc["metadata"]["name"]
            names.append(name)
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            status, current = self.request("GET", path)
            if status == 404:
                self.create(doc)
            elif "conversion" in doc["spec"] and current["spec"].get("conversion") != doc[
                "spec"
            ].get("conversion"):
                # Installed from ../shared/crds without the conversion webhook that the
                # upstream kustomization adds: give it the same one.
                current["spec"]["conversion"] = doc["spec"]["conversion"]
                self.must("PUT", path, current)
        deadline = time.monotonic() + 60
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for name in sorted(pending):
                crd = self.must(
                    "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
                if any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                ):
                    pending.discard(name)
            time.sleep(0.1)
        if pending:
            raise ControlPlaneError(f"CRDs not Established after 60s: {sorted(pending)}")

    def crds_of(self, folder: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
        """The CRDs of a kustomization folder, with its conversion-webhook patches as URLs."""
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        crds = {
            d["metadata"]["name"]: d
            for name in kustomization.get("resources", [])
            for d in _docs(folder / name)
        }
        for patch in kustomization.get("patches", []):
            for doc in _docs(folder / patch["path"]):
                conversion = (doc.get("spec") or {}).get("conversion")
                if conversion is None or doc["metadata"]["name"] not in crds:
                    continue  # cert-manager's cainjection annotations: not used here
                conversion = copy.deepcopy(conversion)
                webhook = conversion.get("webhook") or {}
                if "clientConfig" in webhook:
                    webhook["clientConfig"] = _to_url(webhook["clientConfig"], port, ca_pem)
                crds[doc["metadata"]["name"]]["spec"]["conversion"] = conversion
        return list(crds.values())

    def register_webhooks(
        self, folder: Path, prefix: str, port: int, ca_pem: bytes
    ) -> list[dict[str, Any]]:
        docs = _kustomize_webhooks(folder)
        for doc in docs:
            doc["metadata"] = {"name": prefix + doc["metadata"]["name"]}
            for hook in doc["webhooks"]:
                hook["clientConfig"] = _to_url(hook["clientConfig"], port, ca_pem)
            self.create(doc)
        return docs

    def rbac(self, folder: Path, files: Sequence[str], prefix: str, namespace: str) -> None:
        for name in files:
            for doc in _prefixed(_docs(folder / name), prefix, namespace):
                self.create(doc)

    def spawn(self, name: str, identity: str, command: list[str], health_port: int = 0) -> None:
        # TMPDIR: controller-runtime's default webhook cert dir is under it (Trainer has no
        # setting for it), and nothing of a test run should land in the real /tmp.
        tmp = self.root / name / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TMPDIR=str(tmp))
        env.pop("KUBECONFIG", None)
        process = self.cluster._spawn(name, command, env=env)
        controller = Controller(
            name,
            identity,
            self.cluster.workdir / f"{name}.log",
            pid=process.pid,
            health_url=f"http://127.0.0.1:{health_port}/readyz" if health_port else "",
        )
        self.result.by_name[name] = controller

    # -- per controller ----------------------------------------------------------------

    def kueue(self, binary: Path) -> None:
        component = components()["kueue"]
        root = module_root("sigs.k8s.io/kueue", component.version)
        config = root / "config" / "components"
        work = self.root / "kueue"
        cert_dir = work / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        port, health = free_port(), free_port()
        service, secret = "kueue-webhook-service", "kueue-webhook-server-cert"
        files = rotator_secret("kueue-ca", "kueue", f"{service}.{KUEUE_NAMESPACE}.svc")
        # As a kubelet would mount the Secret: the rotator only checks that the files exist.
        for name, data in files.items():
            if name != "ca.key":
                (cert_dir / name).write_bytes(data)
        self.service_account(KUEUE_NAMESPACE, "kueue-controller-manager")
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": KUEUE_NAMESPACE},
                "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
            }
        )
        self.rbac(
            config / "rbac",
            (
                "role.yaml",
                "role_binding.yaml",
                "leader_election_role.yaml",
                "leader_election_role_binding.yaml",
                "manager_secrets_role.yaml",
                "manager_secrets_role_binding.yaml",
            ),
            "kueue-",
            KUEUE_NAMESPACE,
        )
        self.install_crds(self.crds_of(config / "crd", port, files["ca.crt"]))
        self.register_webhooks(config / "webhook", "kueue-", port, files["ca.crt"])
        # The visibility API is an aggregated API server on a fixed port (8082); it is
        # not under test, and two runs on one machine would fight over the port.
        gates: dict[str, bool] = {"VisibilityOnDemand": False}
        # A cluster's own feature gates join the rig's (Kueue takes them from its
        # configuration or from --feature-gates, never both).
        gates.update(self.cluster.kueue_settings.get("featureGates") or {})
        settings: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            # Metrics off: nothing scrapes them here, and a fixed port would collide with
            # a second test run on the same machine.
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": service,
                "webhookSecretName": secret,
            },
            "clientConnection": {"qps": 300, "burst": 500},  # upstream's values
            "integrations": {
                "frameworks": [
                    "batch/job",
                    "jobset.x-k8s.io/jobset",
                    "trainer.kubeflow.org/trainjob",
                ]
            },
        }
        settings.update(self.cluster.kueue_settings)
        settings["featureGates"] = gates
        text = yaml.safe_dump(settings)
        config_path = work / "config.yaml"
        config_path.write_text(text)
        # As upstream deploys it: the configuration is the ConfigMap kueue-manager-config
        # (key controller_manager_config.yaml), which the Deployment mounts as Kueue's
        # --config file. Kueue reads the file written above; the ConfigMap holds the same
        # text, for whoever reads Kueue's configuration from the cluster (holdwarden's
        # preflight does, for kueueForceDelete and kueueRetention).
        self.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": KUEUE_CONFIG_MAP, "namespace": KUEUE_NAMESPACE},
                "data": {KUEUE_CONFIG_KEY: text},
            }
        )
        kubeconfig = self.token_kubeconfig(KUEUE_NAMESPACE, "kueue-controller-manager", "kueue")
        self.spawn(
            "kueue",
            f"system:serviceaccount:{KUEUE_NAMESPACE}:kueue-controller-manager",
            [
                str(binary),
                f"--config={config_path}",
                f"--kubeconfig={kubeconfig}",
                "--zap-log-level=2",
            ],
            health,
        )
        self.result.by_name["kueue"].webhook_port = port

    def _serving(self, service: str, namespace: str, cert_dir: Path) -> bytes:
        assert self.cluster.ca is not None
        pair = generate_serving(self.cluster.ca, service, namespace, ip_addresses=["127.0.0.1"])
        cert_dir.mkdir(parents=True, exist_ok=True)
        (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
        (cert_dir / "tls.key").write_bytes(pair.key_pem)
        return self.cluster.ca.cert_pem

    def trainer(self, binary: Path) -> None:
        component = components()["trainer"]
        root = module_root("github.com/kubeflow/trainer/v2", component.version)
        manifests = root / "manifests" / "base"
        work = self.root / "trainer"
        port, health = free_port(), free_port()
        account = "kubeflow-trainer-controller-manager"
        # controller-runtime's default cert dir, under the TMPDIR that spawn() sets.
        ca_pem = self._serving(
            account, TRAINER_NAMESPACE, work / "tmp" / "k8s-webhook-server" / "serving-certs"
        )
        self.service_account(TRAINER_NAMESPACE, account)
        self.rbac(manifests / "rbac", ("role.yaml", "role_binding.yaml"), "", TRAINER_NAMESPACE)
        self.install_crds(self.crds_of(manifests / "crds", port, ca_pem))
        self.register_webhooks(manifests / "webhook", "", port, ca_pem)
        settings = {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            "health": {
                "healthProbeBindAddress": f"127.0.0.1:{health}",
                "readinessEndpointName": "readyz",
                "livenessEndpointName": "healthz",
            },
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": port, "host": "127.0.0.1"},
            "leaderElection": {"leaderElect": False},
            # Off: certificates are provided (the upstream mode for cert-manager).
            "certManagement": {"enable": False},
            "clientConnection": {"qps": 50, "burst": 100},  # upstream's values
        }
        config_path = work / "config.yaml"
        config_path.write_text(yaml.safe_dump(settings))
        kubeconfig = self.token_kubeconfig(TRAINER_NAMESPACE, account, "trainer")
        self.spawn(
            "trainer",
            f"system:serviceaccount:{TRAINER_NAMESPACE}:{account}",
            [str(binary), f"--config={config_path}", f"--kubeconfig={kubeconfig}"],
            health,
        )
        self.result.by_name["trainer"].webhook_port = port

    def jobset(self, binary: Path) -> None:
        component = components()["jobset"]
        root = module_root("sigs.k8s.io/jobset", component.version)
        config = root / "config" / "components"
        work = self.root / "jobset"
        port, health = free_port(), free_port()
        account = "jobset-controller-manager"
        cert_dir = work / "certs"
        ca_pem = self._serving("jobset-webhook-service", JOBSET_NAMESPACE, cert_dir)
        self.service_account(JOBSET_NAMESPACE, account)
        self.rbac(
            config / "rbac",
            (
                "role.yaml",
                "role_binding.yaml",
                "leader_election_role.yaml",
                "leader_election_role_binding.yaml",
                "manager_secrets_role.yaml",
                "manager_secrets_role_binding.yaml",
            ),
            "jobset-",
            JOBSET_NAMESPACE,
        )
        self.install_crds(self.crds_of(config / "crd", port, ca_pem))
        self.register_webhooks(config / "webhook", "jobset-", port, ca_pem)
        settings = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        }
        config_path = work / "config.yaml"
        config_path.write_text(yaml.safe_dump(settings))
        kubeconfig = self.token_kubeconfig(JOBSET_NAMESPACE, account, "jobset")
        self.spawn(
            "jobset",
            f"system:serviceaccount:{JOBSET_NAMESPACE}:{account}",
            [str(binary), f"--config={config_path}", f"--kubeconfig={kubeconfig}"],
            health,
        )
        self.result.by_name["jobset"].webhook_port = port

    def kube_controller_manager(self, binary: Path) -> None:
        assert self.cluster.ca is not None
        # The identity kubeadm gives it; the apiserver's bootstrap RBAC binds it.
        pair = generate_client(self.cluster.ca, "system:kube-controller-manager")
        work = self.root / "kube-controller-manager"
        work.mkdir(parents=True, exist_ok=True)
        (work / "client.crt").write_bytes(pair.cert_pem)
        (work / "client.key").write_bytes(pair.key_pem)
        (work / "client.key").chmod(0o600)
        kubeconfig = self.kubeconfig(
            "kube-controller-manager",
            {
                "client-certificate": str(work / "client.crt"),
                "client-key": str(work / "client.key"),
            },
        )
        controllers, lifecycle = kcm_selection(
            pods=self.cluster.pods, nodes=bool(self.cluster.node_count)
        )
        if self.cluster.pods:
            # What the service-account token and root-CA publisher need.
            work_root = self.cluster.workdir
            lifecycle += [
                f"--root-ca-file={work_root / 'ca.crt'}",
                f"--service-account-private-key-file={work_root / 'sa.key'}",
            ]
        self.spawn(
            "kube-controller-manager",
            "system:serviceaccount:kube-system:job-controller",
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                # Only what a TrainJob's pods need: the Job controller makes and deletes
                # them, the garbage collector removes what an owner deletion leaves; with
                # nodes, the node lifecycle too (NODE_LIFECYCLE_FLAGS).
                "--controllers=" + ",".join(controllers),
                # Each controller as its own service account, as in a real cluster.
                "--use-service-account-credentials=true",
                *lifecycle,
                "--leader-elect=false",
                "--secure-port=0",
                # With nodes, 2: the node-lifecycle controller says why it taints (or not).
                "--v=2" if self.cluster.node_count else "--v=1",
            ],
        )
        core = k8s.CoreV1Api(self.api)

        def accounts_exist() -> bool:
            try:
                for name in _KCM_SERVICE_ACCOUNTS:
                    core.read_namespaced_service_account(name, "kube-system")
            except k8s.ApiException:
                return False
            return True

        self.result.by_name["kube-controller-manager"].ready = accounts_exist

    # -- readiness ---------------------------------------------------------------------

    def wait_ready(self, deadline: float) -> None:
        pending = dict(self.result.by_name)
        processes = {name: p for name, p in self.cluster._processes}
        while pending:
            for name, controller in sorted(pending.items()):
                process = processes[name]
                if process.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {process.returncode} during start-up\n"
                        f"--- {name} log tail ---\n{controller.log_tail()}"
                    )
                if _is_ready(controller):
                    del pending[name]
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {n} log tail ---\n{c.log_tail()}" for n, c in pending.items()
                )
                raise ControlPlaneError(
                    f"controllers not ready after {_READY_TIMEOUT_S:.0f}s: {sorted(pending)}\n"
                    + tails
                )
            time.sleep(0.25)

    def training_runtime(self, deadline: float) -> None:
        """The upstream ClusterTrainingRuntime the TrainJobs name, through Trainer's webhook."""
        root = module_root("github.com/kubeflow/trainer/v2", components()["trainer"].version)
        (doc,) = _docs(root / "manifests" / "base" / "runtimes" / "torch_distributed.yaml")
        if doc["metadata"]["name"] != TRAINING_RUNTIME:
            raise ControlPlaneError(f"upstream runtime renamed: {doc['metadata']['name']}")
        path = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
        while True:
            status, data = self.request("POST", path, doc)
            if 200 <= status < 300 or status == 409:
                return
            # A webhook that has just started may still refuse connections for a moment.
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"creating the ClusterTrainingRuntime: {status} {data}")
            time.sleep(0.5)


def _is_ready(controller: Controller) -> bool:
    if controller.ready is not None:
        return controller.ready()
    try:
        with urllib.request.urlopen(controller.health_url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_controllers(cluster: LocalCluster, names: Sequence[str]) -> RealControllers:
    """Run ``names`` (a subset of ``CONTROLLERS``) on ``cluster``; see the module's invariants."""
    setup = _Setup(cluster, names)
    try:
        binaries = controller_binaries(setup.names)
        steps = {
            "kube-controller-manager": setup.kube_controller_manager,
            "jobset": setup.jobset,
            "trainer": setup.trainer,
            "kueue": setup.kueue,
        }
        # Consumers after producers: the pods' controller first, Kueue (which gates
        # everything through its webhooks) last.
        for name in ("kube-controller-manager", "jobset", "trainer", "kueue"):
            if name in setup.names:
                steps[name](binaries[name])
        deadline = time.monotonic() + _READY_TIMEOUT_S
        setup.wait_ready(deadline)
        if "trainer" in setup.names:
            setup.training_runtime(deadline + 30)
    finally:
        setup.close()
    return setup.result
