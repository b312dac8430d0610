"""``holdwarden demo``: the whole story on a local control plane, narrated.

It starts the same real etcd + kube-apiserver the tests use, makes certificates with
``holdwarden certs generate``, runs the enforcer with ``holdwarden serve``, registers it
with the API server and injects its caBundle with ``holdwarden certs inject``, then walks
the supervisor (through the adapter library) and a person (through plain API writes)
through holds in Kueue mode and plain mode.

By default the real Kueue, Trainer, JobSet and kube-controller-manager run (the same
binaries and set-up as ``tests/real``, built on first use; under a minute warm), the
readmission gate decides re-admission, and the story shows what they do: Kueue's
eviction, the pods the Job controller deletes, a pod of the held execution that outlives
the hold (a finalizer stands in for a node that cannot be reached), and re-admission only
once it is gone. With ``--controllers played`` no controller runs: the demo plays Kueue's
and Trainer's one relevant step each, acting through their service accounts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from holdwarden.adapter import Adapter, CallMeta
from holdwarden.adapter.errors import AdapterError, PodsRemain
from holdwarden.config import Config
from holdwarden.vocabulary import TRAINJOB, WORKLOAD, Annotations
from rig.builders import kueue_workload_body, trainjob_body
from rig.localcluster import (
    EDITOR_USER,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    LocalCluster,
)
from rig.localcluster.demostage import (
    DEMO_LABEL,
    READMISSION_CHECK,
    controllers_unrefused,
    enforcer,
    holdwarden_cli,
    inject,
    readmission_gate,
    register_webhook,
    say,
    show,
    wait_enforced,
)
from rig.localcluster.realstory import (
    LOCAL_QUEUE,
    PODS_REMAIN,
    Objects,
    condition,
    eventually,
    make_queues,
    with_requests,
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the scripted story on a local control plane",
        description="Start a local etcd + kube-apiserver and walk through the hold story.",
    )
    parser.add_argument(
        "--controllers",
        choices=("real", "played"),
        default="real",
        help="real (default): run the real Kueue, Trainer, JobSet and kube-controller-manager "
        "(built on first use and cached in $HOLDWARDEN_CACHE; under a minute warm); "
        "played: no controllers, the demo plays their one step each (faster, no builds)",
    )
    parser.add_argument(
        "--story",
        choices=("hold", "lost-node"),
        default="hold",
        help="hold (default): the whole hold story in both modes; lost-node: the real node "
        "lifecycle (kube-scheduler, kwok nodes): a node is lost, the job held, readmitted "
        "only once the lost node's pods are provably gone (needs the real controllers)",
    )
    parser.set_defaults(handler=run_demo)


def _deadline(seconds: float = 30) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


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
        body = kueue_workload_body(job, queue="team-a", count=2, image="pytorch")
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


def _refusal(exc: k8s.ApiException) -> str:
    message = json.loads(exc.body or "{}").get("message", str(exc))
    return f"refused by the API server ({exc.status}):\n   {message}"


def _observe(adapter: Adapter, ref: Any) -> None:
    show("observe", adapter.observe(ref).to_dict())


def _kueue_chapter(cluster: LocalCluster, namespace: str, audit_log: Path, real: bool) -> None:
    """Kueue mode. ``real``: the real Kueue admits, evicts and re-admits (through the
    readmission gate); otherwise the demo plays Kueue's Workload creation."""
    notes = Annotations()
    supervisor_api = cluster.api_client(SUPERVISOR_IDENTITY)
    objects = Objects(cluster.api_client(), namespace, "llm-pretrain")
    adapter = Adapter(Config(mode="kueue", holder="dispatch"), supervisor_api)

    if real:
        say("Kueue mode, real Kueue. The supervisor starts TrainJob llm-pretrain and opens it")
        body = with_requests(_trainjob(namespace, "llm-pretrain", queue=LOCAL_QUEUE))
        ref = adapter.start(body, CallMeta(_deadline()))
        adapter.open(ref, CallMeta(_deadline()))
        began = time.monotonic()
        first = eventually(objects.pod_uids, "Kueue admits and the first pods exist")
        print(
            f"   Kueue admitted it through the readmission gate; Trainer, JobSet and the Job "
            f"controller made {len(first)} pods in {time.monotonic() - began:.1f}s"
        )
        eventually(lambda: objects.attempt() == "1", "the gate records attempt 1")
        _observe(adapter, ref)
        kept = objects.keep(objects.pods()[0])
        print(f"   pod {kept} will be slow to go (a finalizer stands in for a lost node)")
    else:
        say("Kueue mode. The supervisor starts TrainJob llm-pretrain; Kueue creates its Workload")
        kueue = _play_kueue(cluster.api_client(KUEUE_IDENTITY), namespace, "llm-pretrain")
        body = _trainjob(namespace, "llm-pretrain", queue="team-a")
        ref = adapter.start(body, CallMeta(_deadline()))
        kueue.join()
        adapter.open(ref, CallMeta(_deadline()))
        _observe(adapter, ref)

    def workload() -> dict[str, Any]:
        found = objects.workload()  # by the TrainJob's job-uid label, as Kueue sets it
        if found is None:
            raise RuntimeError(f"no Workload of TrainJob {namespace}/llm-pretrain")
        return found

    def trainjob_version() -> str:
        return str(objects.trainjob()["metadata"]["resourceVersion"])

    say("A node is lost: the supervisor places hold instance 1 (one update of the Workload)")
    before = trainjob_version()
    adapter.hold(ref, CallMeta(_deadline(), instance=1), reason="node-3 lost")
    held = workload()
    show("Workload spec.active", held["spec"]["active"])
    show("Workload annotations", _annotations(held, notes.prefix))
    if real:
        # Kueue reacts to the inactive Workload: it evicts and suspends the TrainJob.
        eventually(objects.suspended, "Kueue suspends the TrainJob")
        evicted = eventually(lambda: condition(objects.workload(), "Evicted"), "the eviction")
        show("Kueue's eviction", {k: evicted.get(k) for k in ("reason", "message")})
        eventually(lambda: len(objects.pods()) == 1, "the Job controller deletes the pods")
        print("   every pod is deleted but the one the lost node still holds")
        _observe(adapter, ref)
    else:
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
        print(f"   {_refusal(exc)}")
    show("Workload still inactive", workload()["spec"]["active"] is False)

    say(
        "The audit trail (holdwarden audit): the demo's dry-run canary, preflight's dry-run "
        "probe and the refusal above"
    )
    subprocess.run(holdwarden_cli("audit", "--log", str(audit_log)), check=True)

    say("Hold instance 2 supersedes 1; a late Release of instance 1 must not lift it")
    adapter.hold(ref, CallMeta(_deadline(), instance=2), reason="node-5 lost")
    try:
        adapter.release(ref, CallMeta(_deadline(), instance=1))
        print("   !! the stale release was accepted")
    except AdapterError as exc:
        print(f"   {type(exc).__name__} ({exc.classification}): {exc}")
    show("hold instance in force", _annotations(workload(), notes.prefix).get(notes.hold_instance))

    if real:
        say("The supervisor releases instance 2, but a pod of the held execution remains")
        adapter.release(ref, CallMeta(_deadline(), instance=2))
        message = eventually(
            lambda: objects.check_message(READMISSION_CHECK, PODS_REMAIN),
            "the readmission gate says the held execution's pod remains",
        )
        print(f"   gate: {message}")
        shown, still = time.monotonic(), True
        while still and time.monotonic() - shown < 5:  # several gate passes, Kueue reacting
            still = objects.suspended()
            time.sleep(0.5)
        if still:
            print("   the readmission gate keeps the job waiting: still suspended 5s later")
        else:
            print("   !! re-admitted while a pod of the held execution remains")
        _observe(adapter, ref)
        say("The lost node's pod is finally gone: now the gate lets Kueue re-admit")
        objects.let_go(kept)
        began = time.monotonic()
        eventually(lambda: not objects.suspended(), "re-admission once the old pods are gone")
        eventually(lambda: objects.attempt() == "2", "the gate records attempt 2")
        second = eventually(lambda: objects.pod_uids() - first, "the second execution's pods")
        print(
            f"   re-admitted in {time.monotonic() - began:.1f}s; attempt (A) is "
            f"{objects.attempt()}; {len(second)} pods of the second execution"
        )
        _observe(adapter, ref)
    else:
        say("The old processes are gone: the supervisor releases instance 2")
        adapter.release(ref, CallMeta(_deadline(), instance=2))
        released = workload()
        show("Workload spec.active", released["spec"]["active"])
        show("hold annotations left", _annotations(released, notes.prefix))


def _plain_chapter(cluster: LocalCluster, namespace: str, real: bool) -> None:
    """Plain mode. ``real``: the real Trainer, JobSet and Job controller make and delete
    the pods, and a Release while one remains is refused (PodsRemain)."""
    adapter = Adapter(
        Config(mode="plain", holder="dispatch"), cluster.api_client(SUPERVISOR_IDENTITY)
    )
    objects = Objects(cluster.api_client(), namespace, "eval-sweep")
    say("Plain mode. A TrainJob is held before it was ever opened")
    body = _trainjob(namespace, "eval-sweep", queue=None)
    ref = adapter.start(with_requests(body) if real else body, CallMeta(_deadline()))
    adapter.hold(ref, CallMeta(_deadline(), instance=1), reason="maintenance")
    _observe(adapter, ref)
    say("Release instance 1: the object stays suspended at its start gate, waiting for Open")
    adapter.release(ref, CallMeta(_deadline(), instance=1))
    _observe(adapter, ref)
    say("Open: now it runs, and attempt (A) counts the execution")
    adapter.open(ref, CallMeta(_deadline()))
    _observe(adapter, ref)
    if not real:
        return
    first = eventually(objects.pod_uids, "Trainer, JobSet and the Job controller make pods")
    print(f"   {len(first)} pods of execution 1")
    kept = objects.keep(objects.pods()[0])
    say("A node is lost: hold instance 2; the Job controller deletes the pods")
    adapter.hold(ref, CallMeta(_deadline(), instance=2), reason="node-7 lost")
    eventually(lambda: len(objects.pods()) == 1, "the Job controller deletes the pods")
    _observe(adapter, ref)
    say("Release while the lost node's pod remains: refused, nothing written")
    try:
        adapter.release(ref, CallMeta(_deadline(), instance=2))
        print("   !! released while a pod of the held execution remains")
    except PodsRemain as exc:
        print(f"   {type(exc).__name__} ({exc.classification}): {exc}")
    say("The pod is gone: Release runs the job again, and A rises")
    objects.let_go(kept)
    eventually(lambda: not objects.pods(), "the held execution's last pod goes")
    adapter.release(ref, CallMeta(_deadline(), instance=2))
    second = eventually(lambda: objects.pod_uids() - first, "the second execution's pods")
    print(f"   {len(second)} pods of execution {objects.attempt()}")
    _observe(adapter, ref)


def _run_lost_node() -> int:
    from rig.localcluster.demo_lostnode import NODES, lost_node_story

    say(
        f"Starting a local control plane with the real controllers and {NODES} kwok nodes "
        "(the first run builds them)"
    )
    workdir = Path(tempfile.mkdtemp(prefix="holdwarden-demo-"))
    try:
        lost_node_story(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    say("Control plane and enforcer stopped; nothing left running")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    real = getattr(args, "controllers", "real") == "real"
    if getattr(args, "story", "hold") == "lost-node":
        if not real:
            print("holdwarden demo: --story lost-node needs the real controllers", file=sys.stderr)
            return 2
        return _run_lost_node()
    say("Starting a local control plane (real etcd + kube-apiserver on 127.0.0.1)")
    workdir = Path(tempfile.mkdtemp(prefix="holdwarden-demo-"))
    controllers: tuple[str, ...] = ()
    if real:
        from rig.localcluster.controllers import CONTROLLERS

        controllers = CONTROLLERS
        print(f"   with the real {', '.join(CONTROLLERS)} (the first run builds them)")
    try:
        with LocalCluster(controllers=controllers) as cluster:
            print(
                f"   ready in {cluster.startup_seconds:.1f}s at {cluster.server_url} "
                f"(CRDs: {cluster.crd_kind})"
            )
            say("Certificates (holdwarden certs generate) and the enforcer (holdwarden serve)")
            with (
                enforcer(workdir) as (url, ca_bundle, audit_log),
                cluster.api_client() as api,
                readmission_gate(cluster) if real else contextlib.nullcontext("") as check,
            ):
                register_webhook(api, url)
                inject(cluster, ca_bundle)
                namespace = cluster.create_namespace("team-a", labels={DEMO_LABEL: "true"})
                wait_enforced(api, namespace)
                if real:
                    queue = make_queues(api, namespace, admission_checks=[check])
                    print(f"   ClusterQueue {queue} admits through AdmissionCheck {check}")
                _kueue_chapter(cluster, namespace, audit_log, real)
                _plain_chapter(cluster, namespace, real)
                if real:
                    say("The audit trail over the whole story")
                    controllers_unrefused(audit_log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    say("Control plane and enforcer stopped; nothing left running")
    return 0
