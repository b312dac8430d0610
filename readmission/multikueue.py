"""What MultiKueue's worker clusters still run of a job: the readmission gate's eyes there.

On a MultiKueue manager cluster a TrainJob whose ``spec.managedBy`` is MultiKueue's has no
pods on the manager. Kueue copies it (same name and namespace) to one worker cluster,
Trainer and JobSet run it there, and a hold on the manager's Workload only makes Kueue
delete that copy; nothing in Kueue waits for its pods to be gone before it dispatches the
job again, possibly to another worker (docs/explanation/readmission-gate.md,
"MultiKueue"). So before the
gate lets such a job be admitted again, it counts what every worker cluster MultiKueue
knows still has of it, through the kubeconfig Secret each ``MultiKueueCluster`` names.

Invariants:
- ``count`` never raises for a worker: a worker it cannot read fully (no Secret, a bad
  kubeconfig, a refused or silent request, a kubeconfig it cannot use) is reported as
  ``unreachable`` with the reason, which ``decisions.worker_blocker`` reads as "pods may
  remain". Only a complete, successful count of a worker reports it clear.
- Every request has a timeout (``timeout`` seconds, no retries), so a silent worker
  costs a decision at most ``2 x timeout`` for its pod list and mirror read, and for
  ``recheck`` seconds after it failed it is reported unreachable without a request
  (silence is never remembered as "clear").
- One API client per worker kubeconfig (the Secret's uid and resourceVersion): a rotated
  Secret gets a new client and the old one is closed.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import KubeConfigLoader

from holdwarden import objects
from holdwarden.kubeclient import embedded_to_memory
from holdwarden.readmission.decisions import WorkerCount
from holdwarden.vocabulary import (
    JOBSET_NAME_LABEL,
    MULTIKUEUE_KUBECONFIG_KEY,
    MULTIKUEUECLUSTER,
    TRAINJOB,
)

log = logging.getLogger("holdwarden.readmission.multikueue")

_REQUEST_ERRORS = (k8s.ApiException, urllib3.exceptions.HTTPError, OSError)
CLUSTERS_LIST = "MultiKueueClusters"
"""The ``cluster`` of the count that reports a failed list of the clusters themselves."""


def _short(exc: BaseException) -> str:
    """One short clause for a failed request (urllib3's own messages run to lines)."""
    if isinstance(exc, k8s.ApiException):
        return f"{exc.status} {exc.reason}".strip()
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "no answer within the timeout"
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return "no connection within the timeout"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return "connection refused or unreachable"
    return f"{type(exc).__name__}: {str(exc)[:120]}"


def kubeconfig_location(cluster: object) -> tuple[str, str] | str:
    """``(locationType, location)`` of a MultiKueueCluster's kubeconfig, or why there is
    none the gate can read (a sentence)."""
    source = objects.section(objects.section(cluster, "spec"), "clusterSource")
    if objects.is_map(source.get("clusterProfileRef")):
        return (
            "it connects through a ClusterProfile, which the readmission gate does not "
            "read; give it a kubeConfig Secret instead"
        )
    kubeconfig = objects.section(source, "kubeConfig")
    location = kubeconfig.get("location")
    if not isinstance(location, str) or not location:
        return "its spec.clusterSource.kubeConfig.location is missing"
    location_type = kubeconfig.get("locationType", "Secret")
    if location_type != "Secret":
        return (
            f"its kubeconfig is a file on Kueue's own filesystem (locationType "
            f"{location_type!r}), which the readmission gate cannot read; store it in a "
            f"Secret in Kueue's namespace instead"
        )
    return ("Secret", location)


class WorkerClusters:
    """Counts a job's pods and mirror TrainJob on every worker MultiKueue knows."""

    def __init__(
        self,
        custom: k8s.CustomObjectsApi,
        core: k8s.CoreV1Api,
        *,
        kueue_namespace: str,
        timeout: float,
        recheck: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._custom = custom
        self._core = core
        self.kueue_namespace = kueue_namespace
        self.timeout = timeout
        self.recheck = recheck
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[tuple[str, str], k8s.ApiClient]] = {}
        self._failed: dict[str, tuple[float, str]] = {}
        self.requests = 0
        """Requests sent to worker clusters (for tests and the metrics)."""

    def close(self) -> None:
        with self._lock:
            for _, api in self._clients.values():
                api.close()  # type: ignore[no-untyped-call]
            self._clients.clear()

    def count(self, namespace: str, name: str) -> tuple[WorkerCount, ...]:
        """What each worker cluster has of the TrainJob ``namespace/name``."""
        try:
            listed: Any = self._custom.list_cluster_custom_object(
                MULTIKUEUECLUSTER.group,
                MULTIKUEUECLUSTER.version,
                MULTIKUEUECLUSTER.plural,
                _request_timeout=self.timeout,
            )
        except _REQUEST_ERRORS as exc:
            return (
                WorkerCount(
                    CLUSTERS_LIST,
                    unreachable=f"listing them failed: {_short(exc)}; grant list on "
                    "multikueueclusters.kueue.x-k8s.io",
                ),
            )
        clusters = [c for c in listed.get("items") or [] if objects.name(c)]
        return tuple(self._count_one(c, namespace, name) for c in clusters)

    def _count_one(self, cluster: object, namespace: str, name: str) -> WorkerCount:
        cluster_name = str(objects.name(cluster))
        failed = self._failed.get(cluster_name)
        if failed is not None and self._clock() < failed[0]:
            return WorkerCount(cluster_name, unreachable=f"{failed[1]} (within {self.recheck:g}s)")
        try:
            api = self._client(cluster_name, cluster)
            self.requests += 1
            response: Any = k8s.CoreV1Api(api).list_namespaced_pod(
                namespace,
                label_selector=f"{JOBSET_NAME_LABEL}={name}",
                _request_timeout=self.timeout,
                _preload_content=False,
            )
            try:
                pods = len(json.loads(response.data).get("items") or [])
            finally:
                response.release_conn()
            self.requests += 1
            mirror = self._mirror_exists(api, namespace, name)
        except _UnusableKubeconfig as exc:
            return self._failure(cluster_name, str(exc))
        except _REQUEST_ERRORS as exc:
            return self._failure(cluster_name, f"request failed: {_short(exc)}")
        self._failed.pop(cluster_name, None)
        return WorkerCount(cluster_name, pods=pods, mirror=mirror)

    def _failure(self, cluster_name: str, reason: str) -> WorkerCount:
        self._failed[cluster_name] = (self._clock() + self.recheck, reason)
        log.warning("MultiKueue worker %s not counted: %s", cluster_name, reason)
        return WorkerCount(cluster_name, unreachable=reason)

    def _mirror_exists(self, api: k8s.ApiClient, namespace: str, name: str) -> bool:
        try:
            k8s.CustomObjectsApi(api).get_namespaced_custom_object(
                TRAINJOB.group,
                TRAINJOB.version,
                namespace,
                TRAINJOB.plural,
                name,
                _request_timeout=self.timeout,
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _client(self, cluster_name: str, cluster: object) -> k8s.ApiClient:
        location = kubeconfig_location(cluster)
        if isinstance(location, str):
            raise _UnusableKubeconfig(location)
        secret_name = location[1]
        try:
            secret = self._core.read_namespaced_secret(
                secret_name, self.kueue_namespace, _request_timeout=self.timeout
            )
        except k8s.ApiException as exc:
            raise _UnusableKubeconfig(
                f"reading its kubeconfig Secret {self.kueue_namespace}/{secret_name} "
                f"failed: {_short(exc)}"
            ) from exc
        meta = secret.metadata or k8s.V1ObjectMeta()
        version = (str(meta.uid), str(meta.resource_version))
        with self._lock:
            cached = self._clients.get(cluster_name)
            if cached is not None and cached[0] == version:
                return cached[1]
        api = _api_client(secret, f"{self.kueue_namespace}/{secret_name}")
        with self._lock:
            old = self._clients.get(cluster_name)
            self._clients[cluster_name] = (version, api)
        if old is not None:
            old[1].close()  # type: ignore[no-untyped-call]
        return api


class _UnusableKubeconfig(Exception):
    """The worker's kubeconfig is missing or cannot be used (the message says why)."""


def _api_client(secret: k8s.V1Secret, where: str) -> k8s.ApiClient:
    """An API client from the ``kubeconfig`` key of ``secret``; no retries (every request
    is bounded by the caller's timeout alone)."""
    raw = (secret.data or {}).get(MULTIKUEUE_KUBECONFIG_KEY)
    if raw is None:
        raise _UnusableKubeconfig(f"Secret {where} has no key {MULTIKUEUE_KUBECONFIG_KEY!r}")
    try:
        document = yaml.safe_load(base64.b64decode(raw, validate=True))
        if not isinstance(document, dict):
            raise ValueError("not a YAML mapping")
        configuration = k8s.Configuration()
        # Its certificates as in-memory files: the image's root is read-only.
        embedded_to_memory(document)
        KubeConfigLoader(config_dict=document).load_and_set(configuration)  # type: ignore[no-untyped-call]
    except (binascii.Error, yaml.YAMLError, ValueError, ConfigException) as exc:
        raise _UnusableKubeconfig(
            f"the kubeconfig in Secret {where} cannot be used: {str(exc)[:200]}"
        ) from exc
    configuration.retries = 0
    return k8s.ApiClient(configuration)
