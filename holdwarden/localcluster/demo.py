"""``holdwarden demo``: the whole story on a local control plane, narrated.

It starts the same real etcd + kube-apiserver the tests use, makes certificates with
``holdwarden certs generate``, runs the enforcer with ``holdwarden serve``, registers it
with the API server and injects its caBundle with ``holdwarden certs inject``, then walks
the supervisor (through the adapter library) and a person (through plain API writes)
through holds in Kueue mode and plain mode. Kueue and Trainer do not run here: the demo
plays their one relevant step each, acting through their service accounts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from adapter import Adapter, CallMeta
from adapter.errors import AdapterError
from holdwarden.config import Config
from holdwarden.localcluster import (
    EDITOR_USER,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    LocalCluster,
)
from holdwarden.localcluster.builders import kueue_workload_body, trainjob_body
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Annotations

DEMO_LABEL = "holdwarden-demo"
WEBHOOK_CONFIG = "holdwarden-enforcer"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the scripted story on a local control plane",
        description="Start a local etcd + kube-apiserver and walk through the hold story.",
    )
    parser.set_defaults(handler=run_demo)


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show(label: str, value: Any) -> None:
    print(f"   {label}: {json.dumps(value, sort_keys=True)}", flush=True)


def _holdwarden(*args: str) -> list[str]:
    # The CLI is invoked as an operator would, through the installed entry point's module.
    return [sys.executable, "-m", "holdwarden.cli", *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _deadline(seconds: float = 30) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@contextmanager
def _enforcer(workdir: Path) -> Iterator[tuple[str, Path, Path]]:
    """Generate certificates and run ``holdwarden serve`` until the block ends."""
    cert_dir = workdir / "tls"
    subprocess.run(
        _holdwarden(
            "certs", "generate", "--service", "holdwarden-webhook",
            "--namespace", "holdwarden-system", "--ip", "127.0.0.1", "--out", str(cert_dir),
        ),
        check=True,
    )  # fmt: skip
    port, metrics_port = _free_port(), _free_port()
    audit_log = workdir / "audit.jsonl"
    config_path = workdir / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "webhook": {
                    "listenAddress": f"127.0.0.1:{port}",
                    "metricsAddress": f"127.0.0.1:{metrics_port}",
                    "certDir": str(cert_dir),
                    "auditLog": str(audit_log),
                }
            }
        )
    )
    log = (workdir / "serve.log").open("wb")
    server = subprocess.Popen(
        _holdwarden("serve", "--config", str(config_path)), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
        for _ in range(100):
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", context=context, timeout=1
                ) as response:
                    if response.status == 200:
                        break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(
                        "holdwarden serve exited:\n" + (workdir / "serve.log").read_text()
                    ) from None
                time.sleep(0.1)
        else:
            raise RuntimeError("holdwarden serve did not become ready in 10s")
        yield f"https://127.0.0.1:{port}/validate", cert_dir / "ca.crt", audit_log
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def _register_webhook(api: k8s.ApiClient, url: str) -> None:
    # A plain dict body: the client serialises it as is.
    rule = {
        "apiGroups": [TRAINJOB.group, WORKLOAD.group],
        "apiVersions": [TRAINJOB.version, WORKLOAD.version],
        "operations": ["CREATE", "UPDATE"],
        "resources": [TRAINJOB.plural, WORKLOAD.plural],
    }
    body: Any = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [
            {
                "name": "holds.holdwarden.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {"url": url},
                "rules": [rule],
                "namespaceSelector": {"matchLabels": {DEMO_LABEL: "true"}},
            }
        ],
    }
    k8s.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(body)


def _play_kueue(api: k8s.ApiClient, namespace: str, name: str) -> threading.Thread:
    """Play Kueue's one step here: create the TrainJob's Workload once it exists."""
    custom = k8s.CustomObjectsApi(api)

    def create_workload() -> None:
        for _ in range(200):
            try:
                job: Any = custom.get_namespaced_custom_object(
                    TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, name
                )
                break
            except k8s.ApiException:
                time.sleep(0.05)
        else:
            return
        uid = job["metadata"]["uid"]
        body = kueue_workload_body(
            job, f"trainjob-{name}-{uid[:5]}", queue="team-a", count=2, image="pytorch"
        )
        custom.create_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural, body
        )

    thread = threading.Thread(target=create_workload, daemon=True)
    thread.start()
    return thread


def _trainjob(namespace: str, name: str, *, queue: str | None) -> dict[str, Any]:
    return trainjob_body(name, namespace=namespace, queue=queue)


def _annotations(obj: dict[str, Any], prefix: str) -> dict[str, str]:
    found = obj["metadata"].get("annotations") or {}
    return {k: v for k, v in found.items() if k.startswith(prefix)}


def _kueue_chapter(cluster: LocalCluster, namespace: str, audit_log: Path) -> None:
    notes = Annotations()
    supervisor_api = cluster.api_client(SUPERVISOR_IDENTITY)
    admin = k8s.CustomObjectsApi(cluster.api_client())
    adapter = Adapter(Config(mode="kueue", holder="dispatch"), supervisor_api)

    say("Kueue mode. The supervisor starts TrainJob llm-pretrain; Kueue creates its Workload")
    kueue = _play_kueue(cluster.api_client(KUEUE_IDENTITY), namespace, "llm-pretrain")
    ref = adapter.start(_trainjob(namespace, "llm-pretrain", queue="team-a"), CallMeta(_deadline()))
    kueue.join()
    adapter.open(ref, CallMeta(_deadline()))
    show("observe", adapter.observe(ref).to_dict())

    def workload() -> dict[str, Any]:
        found: Any = admin.list_namespaced_custom_object(
            WORKLOAD.group, WORKLOAD.version, namespace, WORKLOAD.plural
        )
        item: dict[str, Any] = found["items"][0]
        return item

    def trainjob_version() -> str:
        found: Any = admin.get_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, ref.name
        )
        return str(found["metadata"]["resourceVersion"])

    say("A node is lost: the supervisor places hold instance 1 (one update of the Workload)")
    before = trainjob_version()
    adapter.hold(ref, CallMeta(_deadline(), instance=1), reason="node-3 lost")
    held = workload()
    show("Workload spec.active", held["spec"]["active"])
    show("Workload annotations", _annotations(held, notes.prefix))
    show("TrainJob resourceVersion unchanged", trainjob_version() == before)

    say(f"{EDITOR_USER} tries to reactivate the held Workload with a merge patch")
    editor = k8s.CustomObjectsApi(cluster.api_client(EDITOR_USER))
    try:
        editor.patch_namespaced_custom_object(
            WORKLOAD.group,
            WORKLOAD.version,
            namespace,
            WORKLOAD.plural,
            held["metadata"]["name"],
            {"spec": {"active": True}},
        )
        print("   !! the write was allowed: the enforcer is not working")
    except k8s.ApiException as exc:
        message = json.loads(exc.body or "{}").get("message", str(exc))
        print(f"   refused by the API server ({exc.status}):\n   {message}")
    show("Workload still inactive", workload()["spec"]["active"] is False)

    say("The audit trail (holdwarden audit): the refusal above, and preflight's dry-run probe")
    subprocess.run(_holdwarden("audit", "--log", str(audit_log)), check=True)

    say("Hold instance 2 supersedes 1; a late Release of instance 1 must not lift it")
    adapter.hold(ref, CallMeta(_deadline(), instance=2), reason="node-5 lost")
    try:
        adapter.release(ref, CallMeta(_deadline(), instance=1))
        print("   !! the stale release was accepted")
    except AdapterError as exc:
        print(f"   {type(exc).__name__} ({exc.classification}): {exc}")
    show("hold instance in force", _annotations(workload(), notes.prefix).get(notes.hold_instance))

    say("The old processes are gone: the supervisor releases instance 2")
    adapter.release(ref, CallMeta(_deadline(), instance=2))
    released = workload()
    show("Workload spec.active", released["spec"]["active"])
    show("hold annotations left", _annotations(released, notes.prefix))


def _plain_chapter(cluster: LocalCluster, namespace: str) -> None:
    adapter = Adapter(
        Config(mode="plain", holder="dispatch"), cluster.api_client(SUPERVISOR_IDENTITY)
    )
    say("Plain mode. A TrainJob is held before it was ever opened")
    ref = adapter.start(_trainjob(namespace, "eval-sweep", queue=None), CallMeta(_deadline()))
    adapter.hold(ref, CallMeta(_deadline(), instance=1), reason="maintenance")
    show("observe", adapter.observe(ref).to_dict())
    say("Release instance 1: the object stays suspended at its start gate, waiting for Open")
    adapter.release(ref, CallMeta(_deadline(), instance=1))
    show("observe", adapter.observe(ref).to_dict())
    say("Open: now it runs, and attempt (A) counts the execution")
    adapter.open(ref, CallMeta(_deadline()))
    show("observe", adapter.observe(ref).to_dict())


def run_demo(args: argparse.Namespace) -> int:
    say("Starting a local control plane (real etcd + kube-apiserver on 127.0.0.1)")
    workdir = Path(tempfile.mkdtemp(prefix="holdwarden-demo-"))
    try:
        with LocalCluster() as cluster:
            print(
                f"   ready in {cluster.startup_seconds:.1f}s at {cluster.server_url} "
                f"(CRDs: {cluster.crd_kind})"
            )
            say("Certificates (holdwarden certs generate) and the enforcer (holdwarden serve)")
            with _enforcer(workdir) as (url, ca_bundle, audit_log), cluster.api_client() as api:
                _register_webhook(api, url)
                subprocess.run(
                    _holdwarden(
                        "certs", "inject", "--webhook-config", WEBHOOK_CONFIG,
                        "--ca-bundle", str(ca_bundle),
                        "--kubeconfig", str(cluster.kubeconfig_path),
                    ),
                    check=True,
                )  # fmt: skip
                namespace = cluster.create_namespace("team-a", labels={DEMO_LABEL: "true"})
                _kueue_chapter(cluster, namespace, audit_log)
                _plain_chapter(cluster, namespace)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    say("Control plane and enforcer stopped; nothing left running")
    return 0
