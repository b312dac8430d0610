"""``python -m holdwarden.webhook.selftest``: send the enforcer one review it must refuse.

The chart's ``helm test`` Pod runs it (charts/holdwarden/templates/tests/review.yaml): one
AdmissionReview over HTTPS, a dry-run UPDATE of a held TrainJob that unsuspends it, which
the enforcer must answer ``allowed: false`` by rule ``held-trainjob-suspended``. The
server's certificate is checked against ``--ca-file`` (the CA bundle the webhook
configuration trusts), so a pass also shows the certificate is the one the apiserver
verifies. It writes nothing to the cluster and needs no API token. Exit 0 on the expected
refusal, 1 otherwise, with one line saying what came back.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any

from holdwarden.config import Config
from holdwarden.vocabulary import TRAINJOB, Annotations, RuleId

RULE = RuleId.HELD_TRAINJOB_SUSPENDED.value


def held_trainjob(annotations: Annotations, suspend: bool) -> dict[str, Any]:
    return {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": {
            "name": "holdwarden-selftest",
            "namespace": "holdwarden-selftest",
            "uid": "00000000-0000-0000-0000-000000000001",
            "annotations": {
                annotations.hold_instance: "1",
                annotations.hold_reason: "helm test",
                annotations.held_at: "2026-01-01T00:00:00Z",
                annotations.held_by: "holdwarden-selftest",
            },
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend},
    }


def review(annotations: Annotations) -> dict[str, Any]:
    """A dry-run UPDATE that unsuspends a held TrainJob: hold-breaking by construction."""
    coords = {"group": TRAINJOB.group, "version": TRAINJOB.version}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {**coords, "kind": TRAINJOB.kind},
            "resource": {**coords, "resource": TRAINJOB.plural},
            "requestKind": {**coords, "kind": TRAINJOB.kind},
            "requestResource": {**coords, "resource": TRAINJOB.plural},
            "name": "holdwarden-selftest",
            "namespace": "holdwarden-selftest",
            "operation": "UPDATE",
            "userInfo": {"username": "holdwarden-selftest", "groups": ["system:authenticated"]},
            "object": held_trainjob(annotations, suspend=False),
            "oldObject": held_trainjob(annotations, suspend=True),
            "dryRun": True,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def send(url: str, ca_file: str, prefix: str, timeout: float) -> tuple[bool, str]:
    """(passed, what came back)."""
    body = review(Annotations(prefix))
    context = ssl.create_default_context(cafile=ca_file)
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            got = json.load(answer)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return False, f"no review answer from {url}: {exc}"
    response = got.get("response") or {}
    if response.get("uid") != body["request"]["uid"]:
        return False, f"the answer is not for this review: {json.dumps(got)[:300]}"
    message = str((response.get("status") or {}).get("message") or "")
    if response.get("allowed") is False and RULE in message:
        return True, f"refused by {RULE}, as it must be: {message[:200]}"
    return False, f"expected a refusal by {RULE}, got: {json.dumps(response)[:300]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m holdwarden.webhook.selftest",
        description="Send the enforcer one hold-breaking review; exit 0 if it refuses it.",
    )
    parser.add_argument("--url", required=True, help="e.g. https://holdwarden.NS.svc/validate")
    parser.add_argument("--ca-file", required=True, help="the CA bundle to verify it with")
    parser.add_argument("--config", help="configuration (for annotationPrefix)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    args = parser.parse_args(argv)
    prefix = Config.from_file(args.config).annotation_prefix if args.config else "holdwarden.io"
    passed, what = send(args.url, args.ca_file, prefix, args.timeout)
    print(f"holdwarden selftest: {'ok' if passed else 'FAILED'}: {what}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
