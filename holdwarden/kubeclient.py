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
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config
from kubernetes.config.config_exception import ConfigException

# The config loaders are untyped; treat them as such.
_loaders: Any = config

DEFAULT_KUBECONFIG = Path("~/.kube/config")

# For --kubeconfig's help: what is used when the flag is not given.
PRECEDENCE_HELP = (
    "$KUBECONFIG, else ~/.kube/config, else the in-cluster service account (kubectl's order)"
)


class KubeconfigError(ConfigException):
    """No usable credentials; the message names the file or variable at fault."""


def _from_file(source: str, files: str, context: str | None) -> k8s.ApiClient:
    try:
        api: k8s.ApiClient = _loaders.new_client_from_config(config_file=files, context=context)
    except (ConfigException, OSError, ValueError, TypeError, AttributeError) as exc:
        # Context missing, malformed YAML, unreadable certificate file...: say which file.
        raise KubeconfigError(f"{source}: {exc}") from exc
    return api


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
