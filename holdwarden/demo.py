"""``holdwarden demo``: the whole story on a local control plane, narrated.

It starts the same real etcd + kube-apiserver the tests use, then walks through
creating a TrainJob and showing it. Later chapters (holds, the enforcer) are added as
those parts land.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kubernetes import client as k8s

from holdwarden.localcluster import LocalCluster
from holdwarden.vocabulary import TRAINJOB


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the scripted story on a local control plane",
        description="Start a local etcd + kube-apiserver and walk through the hold story.",
    )
    parser.set_defaults(handler=run_demo)


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_demo(args: argparse.Namespace) -> int:
    say("Starting a local control plane (real etcd + kube-apiserver on 127.0.0.1)")
    with LocalCluster() as cluster:
        print(
            f"   ready in {cluster.startup_seconds:.1f}s at {cluster.server_url}, CRDs: "
            f"{cluster.crd_kind}"
        )
        namespace = cluster.create_namespace("demo")
        with cluster.api_client() as api:
            custom = k8s.CustomObjectsApi(api)
            say("Creating TrainJob demo/llm-pretrain")
            body = {
                "apiVersion": TRAINJOB.api_version,
                "kind": TRAINJOB.kind,
                "metadata": {"name": "llm-pretrain"},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True},
            }
            created: Any = custom.create_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, body
            )
            shown = {
                "metadata": {
                    k: created["metadata"][k]
                    for k in ("name", "namespace", "uid", "resourceVersion")
                },
                "spec": created["spec"],
            }
            print(json.dumps(shown, indent=2))
    say("Control plane stopped; nothing left running")
    return 0
