"""Self-managed certificates (certs/selfmanaged.py) on the real kube-apiserver.

Each test starts from a fresh namespace with no Secret and a ValidatingWebhookConfiguration
whose webhooks have an empty caBundle and point at enforcers in this process (TLS on
127.0.0.1). The enforcers, in self-managed mode, must make the Secret, inject the bundle
and become ready with no other step; the apiserver's calls to them must then succeed,
through serving renewals and CA rotations too.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.certs.bundle import parse_bundle
from holdwarden.certs.generate import fingerprint
from holdwarden.certs.selfmanaged import SecretError, SelfManagedTLS, parse_secret
from holdwarden.cli.enforcer import EnforcerServer
from holdwarden.cli.serve import verify_enforcer
from holdwarden.config import CertificatesConfig, Config, WebhookConfig
from holdwarden.leaderelection import ElectionTiming
from holdwarden.vocabulary import TRAINJOB, Annotations
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster
from rig.localcluster.ports import free_port
from tests.support.enforcer_tls import run_in_thread
from tests.support.kustomize import render
from tests.support.shipped_webhook import (
    local_registration,
    local_webhook,
)

pytestmark = pytest.mark.controlplane

A = Annotations()
LABEL = "holdwarden.io/self-managed-test"
ROOT = Path(__file__).resolve().parents[2]
ROLE = "holdwarden-certificates"
FAST_LEASE = ElectionTiming(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


@dataclass
class Replica:
    server: EnforcerServer
    tls: SelfManagedTLS
    port: int
    stop: Callable[[], None]

    def ready(self) -> bool:
        return self.server.state.ready and self.tls.unready_reason() is None


def start_replica(
    config: Config, api: k8s.ApiClient, identity: str, timing: ElectionTiming = FAST_LEASE
) -> Replica:
    """An EnforcerServer in its own thread and event loop, its TLS from SelfManagedTLS."""
    tls = SelfManagedTLS(config, api, verify=verify_enforcer, identity=identity, timing=timing)
    server = EnforcerServer(config, tls=tls)
    stop = run_in_thread(server, f"enforcer-{identity}")
    return Replica(server, tls, server.port, stop)


def settings(namespace: str, token: str, **changes: Any) -> CertificatesConfig:
    base = CertificatesConfig(
        mode="self-managed",
        secret_name="holdwarden-certificates",
        namespace=namespace,
        webhook_configuration=f"holdwarden-selfmanaged-{token}",
        ip_addresses=("127.0.0.1",),
        interval=timedelta(milliseconds=500),
        propagation_delay=timedelta(seconds=2),
    )
    return msgspec.structs.replace(base, **changes)


def config_for(certs: CertificatesConfig, port: int, work: Path) -> Config:
    return Config(
        webhook=WebhookConfig(
            listen_address=f"127.0.0.1:{port}",
            metrics_address="127.0.0.1:0",
            audit_log=work / f"audit-{port}.jsonl",
            certificates=certs,
        )
    )


def webhook_configuration(name: str, token: str, ports: list[int]) -> Any:
    """Webhooks with an empty caBundle, one per port, matching namespaces labelled token."""
    return local_registration(
        name,
        *(
            local_webhook(port, {LABEL: token}, name=f"holds-{i}.holdwarden.io")
            for i, port in enumerate(ports)
        ),
    )


@pytest.fixture
def setup(cluster: LocalCluster, admin_client: k8s.ApiClient) -> Iterator[tuple[str, str]]:
    yield from fresh_scene(cluster, admin_client)


def fresh_scene(cluster: LocalCluster, admin_client: k8s.ApiClient) -> Iterator[tuple[str, str]]:
    """(namespace, token): an empty namespace the webhooks match; configurations made with
    the token's name are deleted afterwards."""
    token = uuid.uuid4().hex[:10]
    namespace = cluster.create_namespace(f"sm-{token}", labels={LABEL: token})
    yield namespace, token
    try:
        k8s.AdmissionregistrationV1Api(admin_client).delete_validating_webhook_configuration(
            f"holdwarden-selfmanaged-{token}", _request_timeout=30
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def wait_for(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {seconds:.0f} s")


def probe_until(
    api: k8s.ApiClient,
    namespace: str,
    done: Callable[[str], bool],
    seconds: float = 30,
    interval: float = 0.2,
) -> list[str]:
    """``refused_probe`` again until ``done`` holds for its outcome, or ``seconds`` pass;
    every outcome, in order (the caller asserts on the last)."""
    outcomes: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        outcomes.append(refused_probe(api, namespace))
        if done(outcomes[-1]):
            break
        time.sleep(interval)
    return outcomes


def sole_leader(replicas: list[Replica], seconds: float = 30) -> Replica:
    """The one replica that leads, seen so on two reads in a row (0.1 s apart), polled.

    ``is_leader()`` is false once a renewal is ``renew_deadline`` late, which a starved
    machine can make a short Lease's renewal be: a single read may catch none leading.
    """
    deadline = time.monotonic() + seconds
    previous: Replica | None = None
    seen: list[int] = []
    while True:
        leaders = [r for r in replicas if r.tls.elector.is_leader()]
        seen.append(len(leaders))
        current = leaders[0] if len(leaders) == 1 else None
        if current is not None and current is previous:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"not one stable leader within {seconds:.0f} s: {seen[-10:]}")
        previous = current
        time.sleep(0.1)


def refused_probe(api: k8s.ApiClient, namespace: str) -> str:
    """A dry-run create the enforcer must refuse: a held TrainJob that is not suspended.

    Returns 'refused' (the enforcer's 403 naming the rule), 'allowed', or what else the
    apiserver answered (a failed webhook call, for instance).
    """
    body = trainjob_body(f"probe-{uuid.uuid4().hex[:6]}", suspend=False)
    body["metadata"]["annotations"] = {A.hold_instance: "1"}
    try:
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(
            TRAINJOB.group,
            TRAINJOB.version,
            namespace,
            TRAINJOB.plural,
            body,
            dry_run="All",
            _request_timeout=30,
        )
    except ApiException as exc:
        text = exc.body or ""
        if exc.status == 403 and "held-trainjob-suspended" in text and "denied the request" in text:
            return "refused"
        return f"{exc.status}: {text[:300]}"
    return "allowed"


def injected_bundles(api: k8s.ApiClient, name: str) -> list[bytes]:
    config: Any = k8s.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
        name, _request_timeout=30
    )
    return [base64.b64decode(w.client_config.ca_bundle or "") for w in config.webhooks]


def handshake(port: int, bundle: bytes) -> str:
    """A fresh TLS handshake to 127.0.0.1:port trusting only ``bundle``: '' or the error."""
    context = ssl.create_default_context(cadata=bundle.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return ""
    except (OSError, ssl.SSLError) as exc:
        return str(exc)


# -- (a) from an empty namespace to serving ----------------------------------------------


def test_from_an_empty_namespace_to_serving_with_no_manual_step(
    setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    namespace, token = setup
    port = free_port()
    certs = settings(namespace, token)
    registrations = k8s.AdmissionregistrationV1Api(admin_client)
    registrations.create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, [port])
    )
    core = k8s.CoreV1Api(admin_client)
    with pytest.raises(ApiException) as absent:
        core.read_namespaced_secret(certs.secret_name, namespace, _request_timeout=30)
    assert absent.value.status == 404
    # Before anything is served, the apiserver cannot call the webhook. It learns of the
    # configuration through an informer, a moment after the create: until then the probe
    # is "allowed" (no webhook called); poll (bounded) for the failed call. A "refused"
    # (something answered at the port by the rule) ends the poll and fails.
    before = probe_until(
        admin_client,
        namespace,
        lambda outcome: outcome == "refused" or "failed calling webhook" in outcome,
        interval=0.1,
    )
    assert "failed calling webhook" in before[-1], before[-3:]

    replica = start_replica(config_for(certs, port, tmp_path), admin_client, "only")
    try:
        wait_for("ready", replica.ready, 60)
        secret: Any = core.read_namespaced_secret(certs.secret_name, namespace, _request_timeout=30)
        assert secret.type == "kubernetes.io/tls"
        assert sorted(secret.data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        parsed = parse_secret(secret.data, "Secret", secret.metadata.resource_version)
        assert replica.tls.loaded_fingerprint == parsed.serving.fingerprint
        # Every webhook of the configuration carries the Secret's bundle.
        bundles = injected_bundles(admin_client, certs.webhook_configuration)
        assert bundles == [base64.b64decode(secret.data["ca.crt"])]
        assert handshake(port, bundles[0]) == ""
        # The apiserver now calls the enforcer: a refusal is the enforcer's own 403.
        outcomes = probe_until(admin_client, namespace, lambda outcome: outcome == "refused")
        assert outcomes[-1] == "refused", outcomes
        assert replica.tls.writes.get("create") == 1
        assert replica.tls.writes.get("inject") == 1
    finally:
        replica.stop()


def test_bad_secret_contents_name_the_secret_and_the_key() -> None:
    with pytest.raises(SecretError, match=r"Secret ns/s has no key 'ca.key'"):
        parse_secret({"ca.crt": "", "tls.crt": "", "tls.key": ""}, "Secret ns/s", "1")
    with pytest.raises(SecretError, match=r"Secret ns/s key 'tls.crt' is not base64"):
        parse_secret(
            {"ca.crt": "", "ca.key": "", "tls.crt": "%%", "tls.key": ""}, "Secret ns/s", "1"
        )
    with pytest.raises(SecretError, match=r"Secret ns/s key 'ca.crt' holds no certificate"):
        parse_secret({"ca.crt": "", "ca.key": "", "tls.crt": "", "tls.key": ""}, "Secret ns/s", "1")


# -- (b) rotation with zero failed calls ------------------------------------------------


def test_rotation_under_traffic_fails_no_apiserver_call(
    setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    """CA 60 s (rotated from 20 s on), serving 30 s (renewed from 10 s on): in 50 s the
    leader renews and rotates several times while the apiserver is driven through the
    webhook and fresh handshakes trust the injected bundle; nothing may fail.

    That no call fails depends on ``propagationDelay`` outlasting the apiserver's lag in
    loading the injected two-CA bundle (its informer, slow on a starved machine): 5 s
    here. It fits: at a CA rotation the serving certificate being replaced has at least
    ``renewBefore`` (20 s) left, so it stays valid through the wait; from creation (t=0)
    the writes go renew t=10, rotate-ca t=20, renew onto the new CA t=25, prune t=31.5
    (``propagationDelay`` + 3 intervals after that renewal), renew t=35, rotate-ca t=40:
    every write the asserts below count is made well inside the 50 s loop."""
    namespace, token = setup
    port = free_port()
    certs = settings(
        namespace,
        token,
        ca_validity=timedelta(seconds=60),
        ca_renew_before=timedelta(seconds=40),
        validity=timedelta(seconds=30),
        renew_before=timedelta(seconds=20),
        propagation_delay=timedelta(seconds=5),
    )
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, [port])
    )
    replica = start_replica(config_for(certs, port, tmp_path), admin_client, "only")
    try:
        wait_for("ready", replica.ready, 60)
        wait_for("enforced", lambda: refused_probe(admin_client, namespace) == "refused", 30)
        outcomes: dict[str, int] = {}
        handshakes = 0
        failed_handshakes: list[str] = []
        served: set[str] = set()
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            outcome = refused_probe(admin_client, namespace)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            (bundle,) = injected_bundles(admin_client, certs.webhook_configuration)
            error = handshake(port, bundle)
            handshakes += 1
            if error:
                failed_handshakes.append(error)
            if replica.tls.loaded_fingerprint:
                served.add(replica.tls.loaded_fingerprint)
        writes = dict(replica.tls.writes)
    finally:
        replica.stop()
    assert set(outcomes) == {"refused"}, outcomes
    assert outcomes["refused"] >= 50, outcomes
    assert failed_handshakes == [], failed_handshakes[:3]
    assert handshakes >= 50
    # What happened meanwhile: several serving certificates, from more than one CA.
    assert writes.get("rotate-ca", 0) >= 1, writes
    assert writes.get("renew", 0) >= 2, writes
    assert writes.get("prune", 0) >= 1, writes
    assert len(served) >= 3, served


# -- (c) two replicas --------------------------------------------------------------------


def test_two_replicas_one_writer_both_serve(
    setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    namespace, token = setup
    ports = [free_port(), free_port()]
    certs = settings(namespace, token)
    # Two webhooks, one per replica: every call goes to both, and both must be injected.
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, ports)
    )
    replicas = [
        start_replica(config_for(certs, port, tmp_path), admin_client, f"replica-{i}")
        for i, port in enumerate(ports)
    ]
    try:
        wait_for("both ready", lambda: all(r.ready() for r in replicas), 60)
        wait_for("enforced", lambda: refused_probe(admin_client, namespace) == "refused", 30)
        leader = sole_leader(replicas)
        (follower,) = [r for r in replicas if r is not leader]
        assert leader.tls.writes.get("create") == 1
        assert follower.tls.writes == {}
        assert follower.tls.loaded_fingerprint == leader.tls.loaded_fingerprint
        bundles = injected_bundles(admin_client, certs.webhook_configuration)
        assert len(bundles) == 2 and bundles[0] == bundles[1]
        assert all(handshake(r.port, bundles[0]) == "" for r in replicas)
        lease: Any = k8s.CoordinationV1Api(admin_client).read_namespaced_lease(
            certs.lease_name, namespace, _request_timeout=30
        )
        assert lease.spec.holder_identity == leader.tls.elector.identity
        # One CA, the Secret's, which signed what both replicas serve.
        secret: Any = k8s.CoreV1Api(admin_client).read_namespaced_secret(
            certs.secret_name, namespace, _request_timeout=30
        )
        parsed = parse_secret(secret.data, "Secret", secret.metadata.resource_version)
        assert [fingerprint(c) for c in parse_bundle(bundles[0])] == [parsed.ca.fingerprint]
        assert parsed.serving.fingerprint == follower.tls.loaded_fingerprint
    finally:
        for replica in replicas:
            replica.stop()


# -- the base's certificate RBAC, and `holdwarden serve --certificates self-managed` -------


def _rendered_rules(kind: str) -> list[dict[str, Any]]:
    objs = render(ROOT / "manifests")  # self-managed is the base's (certificates.yaml)
    (role,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == ROLE]
    return list(role["rules"])


def test_the_components_rbac_is_all_it_needs(
    cluster: LocalCluster, setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    """The enforcer runs as a service account bound to the base's certificate rules
    (in the test's namespace, the configuration's name put in the ClusterRole), and gets
    from an empty namespace to serving with no failed request once the binding is live."""
    namespace, token = setup
    port = free_port()
    certs = settings(namespace, token)
    user = f"system:serviceaccount:{namespace}:holdwarden"
    rbac = k8s.RbacAuthorizationV1Api(admin_client)
    subject = [k8s.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")]
    role: Any = {"metadata": {"name": ROLE}, "rules": _rendered_rules("Role")}
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name=ROLE),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=ROLE),
            subjects=subject,
        ),
    )
    cluster_rules = _rendered_rules("ClusterRole")
    assert [r["resourceNames"] for r in cluster_rules] == [["holdwarden-enforcer"]]
    for rule in cluster_rules:
        rule["resourceNames"] = [certs.webhook_configuration]
    cluster_role = f"{ROLE}-{token}"
    cluster_role_body: Any = {"metadata": {"name": cluster_role}, "rules": cluster_rules}
    rbac.create_cluster_role(cluster_role_body)
    rbac.create_cluster_role_binding(
        k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name=cluster_role),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role
            ),
            subjects=subject,
        )
    )
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, [port])
    )
    api = cluster.api_client(user)
    try:
        # RBAC reaches the authorizer through a watch: wait (bounded) until it has.
        authz = k8s.AuthorizationV1Api(api)

        def may_update_configuration() -> bool:
            attributes = {
                "verb": "update",
                "group": "admissionregistration.k8s.io",
                "resource": "validatingwebhookconfigurations",
                "name": certs.webhook_configuration,
            }
            body: Any = {"spec": {"resourceAttributes": attributes}}
            review: Any = authz.create_self_subject_access_review(body, _request_timeout=30)
            return bool(review.status.allowed)

        wait_for("RBAC live", may_update_configuration, 20)
        replica = start_replica(config_for(certs, port, tmp_path), api, "restricted")
        try:
            wait_for("ready", replica.ready, 60)
            wait_for("enforced", lambda: refused_probe(admin_client, namespace) == "refused", 30)
            assert replica.tls.errors == 0, replica.tls.last_error
            assert replica.tls.writes.get("create") == 1
            assert replica.tls.writes.get("inject") == 1
        finally:
            replica.stop()
    finally:
        api.close()  # type: ignore[no-untyped-call]
        rbac.delete_cluster_role_binding(cluster_role, _request_timeout=30)
        rbac.delete_cluster_role(cluster_role, _request_timeout=30)


def test_serve_command_self_managed_from_empty_to_ready_and_releases_the_lease(
    cluster: LocalCluster, setup: tuple[str, str], admin_client: k8s.ApiClient, tmp_path: Path
) -> None:
    """`holdwarden serve --certificates self-managed` (the flag over a files-mode config)."""
    namespace, token = setup
    port, metrics_port = free_port(), free_port()
    certs = settings(namespace, token)
    k8s.AdmissionregistrationV1Api(admin_client).create_validating_webhook_configuration(
        webhook_configuration(certs.webhook_configuration, token, [port])
    )
    section = {
        "mode": "files",
        "namespace": namespace,
        "webhookConfiguration": certs.webhook_configuration,
        "ipAddresses": ["127.0.0.1"],
        "interval": "500ms",
        "propagationDelay": "1s",
    }
    config = {
        "webhook": {
            "listenAddress": f"127.0.0.1:{port}",
            "metricsAddress": f"127.0.0.1:{metrics_port}",
            "auditLog": str(tmp_path / "audit.jsonl"),
            "shutdownDelay": "0s",
            "certificates": section,
        }
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "holdwarden.cli", "serve", "--config"]
    server = subprocess.Popen(
        [*command, str(tmp_path / "config.yaml"), "--certificates", "self-managed"],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert server.poll() is None, server.communicate()[0].decode()[-3000:]
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{metrics_port}/readyz", timeout=5
                ) as got:
                    return bool(got.status == 200)
            except OSError:
                return False

        wait_for("serve ready", ready, 60)
        wait_for("enforced", lambda: refused_probe(admin_client, namespace) == "refused", 30)
    finally:
        server.terminate()
        output = server.communicate(timeout=40)[0].decode()
    assert server.returncode == 0, output[-3000:]
    assert "self-managed certificates: create" in output
    # Stopping released the Lease, so another replica takes over at once.
    lease: Any = k8s.CoordinationV1Api(admin_client).read_namespaced_lease(
        certs.lease_name, namespace, _request_timeout=30
    )
    assert not lease.spec.holder_identity
