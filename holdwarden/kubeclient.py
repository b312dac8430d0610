"""The one way holdwarden connects to a cluster, with kubectl's precedence.

Invariant: the credentials come from the first of these that is given, and nothing else:

1. ``kubeconfig`` (the ``--kubeconfig`` flag): that file, which must exist;
2. ``$KUBECONFIG``: its files (``:``-separated, merged as kubectl merges them), at least
   one of which must exist;
3. ``~/.kube/config``, when it exists;
4. the in-cluster service-account credentials (a Pod with a mounted token).

``context`` picks a context of the kubeconfig (default: its current-context); naming one
where no kubeconfig is found is an error. Every failure is a ``KubeconfigError`` whose
message names the file (or the variable) it came from. No global client configuration is
changed.

Certificates embedded in a kubeconfig (``certificate-authority-data``, ``client-certificate-
data``, ``client-key-data``) are handed to TLS as in-memory files (``memory_file``: a sealed
memfd, opened by its ``/proc/self/fd`` path), never written to disk: the kubernetes client
would write them to a temporary directory, and the image's root filesystem is read-only
with no writable one (the shipped manifests mount an emptyDir at ``/tmp`` for ``serve``;
``holdwarden`` run elsewhere from the image has none). The private key never reaches a
disk either. Where memfd is missing (not Linux), the client's temporary files are used.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import os
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import ConfigNode, KubeConfigLoader, KubeConfigMerger

# The config loaders are untyped; treat them as such.
_loaders: Any = config

DEFAULT_KUBECONFIG = Path("~/.kube/config")

# For --kubeconfig's help: what is used when the flag is not given.
PRECEDENCE_HELP = (
    "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account (kubectl's order)"
)


class KubeconfigError(ConfigException):
    """No usable credentials; the message names the file or variable at fault."""


# An embedded field and the file field the kubernetes client reads in its place.
_EMBEDDED = {
    "clusters": ("cluster", (("certificate-authority-data", "certificate-authority"),)),
    "users": (
        "user",
        (("client-certificate-data", "client-certificate"), ("client-key-data", "client-key")),
    ),
}
_memory_files: dict[bytes, str] = {}
_memory_lock = threading.Lock()


def memory_file(content: bytes, label: str) -> str | None:
    """A path that reads back ``content`` and lives on no filesystem: a sealed memfd of this
    process, as ``/proc/self/fd/N``. Kept open for the process's life, one per distinct
    content (as the kubernetes client keeps its temporary files). None where memfd or
    ``/proc/self/fd`` is missing."""
    if not hasattr(os, "memfd_create") or not Path("/proc/self/fd").is_dir():
        return None
    key = hashlib.sha256(content).digest()
    with _memory_lock:
        found = _memory_files.get(key)
        if found is not None:
            return found
        fd = os.memfd_create(f"holdwarden-{label}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            # Nobody, this process included, can change it after this.
            seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        except OSError:
            os.close(fd)
            raise
        path = f"/proc/self/fd/{fd}"
        _memory_files[key] = path
        return path


def _plain(node: Any) -> Any:
    return node.value if isinstance(node, ConfigNode) else node


def embedded_to_memory(document: Any, context: str | None = None) -> None:
    """Replace, in place, the embedded certificates of ``context``'s cluster and user (default:
    the current context) in a kubeconfig ``document`` (a dict, or the merger's tree) by
    in-memory files (``memory_file``). Anything malformed is left for the kubernetes
    client to report; where no memory file can be made, the document is left as it is."""
    root = _plain(document)
    if not isinstance(root, Mapping):
        return
    name = context or root.get("current-context")
    chosen = _named(root.get("contexts"), name)
    body = _plain(chosen.get("context")) if chosen is not None else None
    if not isinstance(body, Mapping):
        return
    for section, (inner, fields) in _EMBEDDED.items():
        entry = _named(root.get(section), body.get(inner))
        target = _plain(entry.get(inner)) if entry is not None else None
        if not isinstance(target, MutableMapping):
            continue
        for data_key, file_key in fields:
            data = target.get(data_key)
            if not isinstance(data, str) or not data:
                continue
            try:
                content = base64.standard_b64decode(data.encode())
            except (binascii.Error, ValueError):
                continue  # the client reports it, naming the field
            path = memory_file(content, file_key)
            if path is None:
                return
            del target[data_key]
            target[file_key] = path


def _named(items: Any, name: Any) -> Mapping[str, Any] | None:
    for item in _plain(items) or []:
        value = _plain(item)
        if isinstance(value, Mapping) and value.get("name") == name:
            return value
    return None


def _from_file(source: str, files: str, context: str | None) -> k8s.ApiClient:
    try:
        # As new_client_from_config reads them (the merge, relative paths), but with the
        # embedded certificates in memory and without writing anything back to the files.
        merged = KubeConfigMerger(files)  # type: ignore[no-untyped-call]
        if merged.config is None:
            raise ConfigException("Invalid kube-config file. No configuration found.")
        embedded_to_memory(merged.config, context)
        configuration = k8s.Configuration()
        loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
            config_dict=merged.config, active_context=context, config_base_path=None
        )
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError, AttributeError) as exc:
        # Context missing, malformed YAML, unreadable certificate file...: say which file.
        raise KubeconfigError(f"{source}: {exc}") from exc
    return k8s.ApiClient(configuration)


def api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """An API client for the CLI, ``holdwarden serve`` and the adapter (see the module doc)."""
    if kubeconfig is not None:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"--kubeconfig {kubeconfig}: no such file")
        return _from_file(f"kubeconfig {kubeconfig}", str(path), context)
    env = os.environ.get("KUBECONFIG", "")
    if env:
        paths = [p for p in env.split(os.pathsep) if p]
        if not any(Path(p).expanduser().is_file() for p in paths):
            raise KubeconfigError(f"$KUBECONFIG={env}: no such file")
        return _from_file(f"$KUBECONFIG={env}", env, context)
    home = DEFAULT_KUBECONFIG.expanduser()
    if home.is_file():
        return _from_file(f"kubeconfig {home}", str(home), context)
    if context is not None:
        raise KubeconfigError(
            f"--context {context}: no kubeconfig to find it in ($KUBECONFIG is unset and "
            f"{home} does not exist)"
        )
    configuration = k8s.Configuration()
    try:
        _loaders.load_incluster_config(client_configuration=configuration)
    except ConfigException as exc:
        raise KubeconfigError(
            f"no Kubernetes credentials: no --kubeconfig, $KUBECONFIG is unset, {home} does "
            f"not exist, and this is not a Pod with a service-account token ({exc})"
        ) from exc
    return k8s.ApiClient(configuration)


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace a bare NAME means, as kubectl picks it: the kubeconfig context's
    ``namespace`` (same precedence as ``api_client``), else the Pod's own namespace in a
    cluster, else ``default``. Never raises: a broken kubeconfig fails later, in
    ``api_client``, with its own message."""
    try:
        files = kubeconfig or os.environ.get("KUBECONFIG") or None
        if files is None and DEFAULT_KUBECONFIG.expanduser().is_file():
            files = str(DEFAULT_KUBECONFIG.expanduser())
        if files is not None:
            contexts, current = _loaders.list_kube_config_contexts(config_file=files)
            chosen = (
                next((c for c in contexts if c["name"] == context), None) if context else current
            )
            namespace = ((chosen or {}).get("context") or {}).get("namespace")
            return str(namespace) if namespace else "default"
    except Exception:  # the loader raises several unrelated types; see the docstring
        return "default"
    token_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return token_ns.read_text().strip() or "default"
    except OSError:
        return "default"
