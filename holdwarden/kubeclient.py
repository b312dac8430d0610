"""The one way holdwarden connects to a cluster.

Invariant: with no kubeconfig and no context named, the in-cluster service-account
credentials are used when present; otherwise the kubeconfig (``$KUBECONFIG`` or
``~/.kube/config`` when ``kubeconfig`` is None). No global client configuration is changed.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes import config
from kubernetes.config.config_exception import ConfigException

# The config loaders are untyped; treat them as such.
_loaders: Any = config


def api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """An API client for the adapter CLI, ``holdwarden serve`` and ``holdwarden certs``."""
    if kubeconfig is None and context is None:
        configuration = k8s.Configuration()
        try:
            _loaders.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            pass
        else:
            return k8s.ApiClient(configuration)
    api: k8s.ApiClient = _loaders.new_client_from_config(config_file=kubeconfig, context=context)
    return api
