"""What a supervisor needs around the adapter's semantics (issue 11), against the REAL local
control plane: the instance bound end to end, errors it can act on, a client it does not
own, preflight that does not mask the call's own errors.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from holdwarden.adapter import Adapter, Config, Ref, State
from holdwarden.adapter.errors import (
    AdapterError,
    Invalid,
    NotFound,
    Rejected,
    Unreachable,
    Unsupported,
)
from holdwarden.adapter.kube import FIELD_MANAGER, Request
from holdwarden.adapter.operations.context import Context
from holdwarden.cli import main
from holdwarden.config import TimeoutsConfig
from holdwarden.vocabulary import MAX_HOLD_INSTANCE, TRAINJOB
from rig.localcluster import LocalCluster
from tests.controlplane.test_adapter_kube import A as KEYS
from tests.controlplane.test_adapter_kube import Cluster, hold_annotations, make, meta
from tests.support.rbac_helpers import wait_allowed

pytestmark = pytest.mark.controlplane


@pytest.fixture
def kc(namespace: str, admin_client: k8s.ApiClient, kueue_client: k8s.ApiClient) -> Cluster:
    return Cluster(namespace, admin_client, kueue_client)


# ==== the instance bound (item 4) =======================================================


@pytest.mark.parametrize("instance", [10**19, 2**63, 9_999_999_999_999_999_999])
def test_an_instance_above_int64_is_invalid_before_any_request(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, instance: int
) -> None:
    """Before the bound, Hold(10**19) wrote "10000000000000000000" and its Release was
    StaleHold; now both are Invalid and nothing is sent (not even the lazy preflight)."""
    seen: list[Request] = []
    adapter = make(cluster, supervisor_client, "kueue", before_request=seen.append)
    ref = Ref("anywhere", "job")
    with pytest.raises(Invalid, match=r"2\^63-1"):
        adapter.hold(ref, meta(instance), "r")
    with pytest.raises(Invalid, match=r"2\^63-1"):
        adapter.release(ref, meta(instance))
    assert seen == [] and adapter.request_count == 0


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_the_largest_instance_holds_and_releases_end_to_end(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, mode: str
) -> None:
    adapter = make(cluster, supervisor_client, mode)
    if mode == "kueue":
        ref, wl_name = kc.kueue_job("job")
        held: Any = lambda: kc.workload(wl_name)  # noqa: E731
    else:
        kc.create_trainjob("job")
        ref = Ref(kc.ns, "job")
        held = lambda: kc.trainjob("job")  # noqa: E731
    adapter.hold(ref, meta(MAX_HOLD_INSTANCE), "largest")
    assert hold_annotations(held())[KEYS.hold_instance] == str(MAX_HOLD_INSTANCE)
    observed = adapter.observe(ref)
    assert observed.state is State.HELD and observed.hold_instance == MAX_HOLD_INSTANCE
    adapter.hold(ref, meta(MAX_HOLD_INSTANCE), "largest")  # already in force: no write
    adapter.release(ref, meta(MAX_HOLD_INSTANCE))
    assert hold_annotations(held()) == {}


# ==== errors a supervisor can act on, a client it does not own (item 5) ================


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then closed): connecting is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _client_for(source: k8s.ApiClient, host: str) -> k8s.ApiClient:
    configuration = copy.deepcopy(source.configuration)
    configuration.host = host
    api = k8s.ApiClient(configuration)
    api.default_headers.update(source.default_headers)
    return api


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_a_refused_connection_is_unreachable_and_says_nothing_was_sent(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, mode: str
) -> None:
    """Before: urllib3 2.x makes NewConnectionError a TimeoutError, so a refused connection
    was reported as "no answer within 60s ... a write may still land" (Rejected)."""
    with _client_for(supervisor_client, f"https://127.0.0.1:{_closed_port()}") as dead:
        adapter = make(cluster, dead, mode)
        ref = Ref("ns", "job")
        began = time.monotonic()
        for call in (
            lambda: adapter.hold(ref, meta(1), "r"),
            lambda: adapter.release(ref, meta(1)),
            lambda: adapter.open(ref, meta()),
            lambda: adapter.observe(ref),
        ):
            with pytest.raises(Unreachable, match="not sent") as raised:
                call()
            assert "may still land" not in str(raised.value)
            assert raised.value.classification == "unreachable" and raised.value.exit_code == 9
            assert isinstance(raised.value, AdapterError)
            assert not isinstance(raised.value, Rejected)
        assert time.monotonic() - began < 5  # refused at once: no timeout was waited for
        adapter.close()


class _Silent:
    """A TCP server that accepts and reads but never answers: a request that was sent.
    ``hang_up``: it closes each connection once it has read the request instead."""

    def __init__(self, *, hang_up: bool = False) -> None:
        self.hang_up = hang_up
        self.requests = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port: int = self.sock.getsockname()[1]
        self.received = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.settimeout(5)
            try:
                if conn.recv(65536):
                    self.requests += 1
                    self.received.set()
            except OSError:
                pass
            if self.hang_up:
                conn.close()

    def close(self) -> None:
        """Stop serving and end the thread. A thread blocked in ``accept`` or ``recv`` is
        woken by ``shutdown``, not by ``close`` (on Linux the blocked call keeps the socket
        open), and a thread left blocked outlives the test into the interpreter's exit."""
        for sock in (self.sock, *self.conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        for sock in (self.sock, *self.conns):
            sock.close()
        assert not self.thread.is_alive(), "the silent server's thread did not end in 10 s"


def test_a_timeout_after_sending_says_it_may_still_land_and_names_call_bound(
    supervisor_client: k8s.ApiClient,
) -> None:
    silent = _Silent()
    try:
        with _client_for(supervisor_client, f"http://127.0.0.1:{silent.port}") as api:
            config = Config(
                mode="plain", timeouts=TimeoutsConfig(apiserver_request=timedelta(seconds=0.5))
            )
            with Adapter(config, api) as adapter, pytest.raises(Rejected) as raised:
                adapter.observe(Ref("ns", "job"))
        assert silent.received.is_set()  # it WAS sent
        text = str(raised.value)
        assert not isinstance(raised.value, Unreachable)
        assert "may still land" in text and "call_bound (5.5s" in text, text
    finally:
        silent.close()


def test_the_callers_client_is_never_modified(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    """Before: the adapter set retries=False on the caller's own pool and cleared it."""
    pool = supervisor_client.rest_client.pool_manager
    before = dict(pool.connection_pool_kw)
    configuration = supervisor_client.configuration
    retries_before = configuration.retries
    adapter = make(cluster, supervisor_client, "plain")
    assert supervisor_client.rest_client.pool_manager is pool
    assert pool.connection_pool_kw == before and configuration.retries == retries_before
    assert adapter.api_client is not supervisor_client
    assert adapter.api_client.configuration is not configuration
    retries = adapter.api_client.rest_client.pool_manager.connection_pool_kw["retries"]
    assert retries is False or retries.total is False
    # The copy keeps who the caller is (impersonation header): the supervisor may hold.
    kc.create_trainjob("job")
    adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
    tj = kc.trainjob("job")
    managers = {m["manager"] for m in tj["metadata"].get("managedFields") or []}
    assert FIELD_MANAGER in managers


def test_close_and_context_manager_leave_the_callers_client_working(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job")
    ref = Ref(kc.ns, "job")
    with make(cluster, supervisor_client, "plain") as adapter:
        assert adapter.observe(ref).state is State.AT_START_GATE
        own_pool = adapter.api_client.rest_client.pool_manager
        assert len(own_pool.pools) > 0
    assert len(own_pool.pools) == 0  # closed on exit
    adapter.close()  # idempotent
    # The caller's client is the caller's: still open, still working.
    k8s.CustomObjectsApi(supervisor_client).get_namespaced_custom_object(
        TRAINJOB.group, TRAINJOB.version, kc.ns, TRAINJOB.plural, "job"
    )


# ==== preflight: cached, refreshable, light in the CLI, after the call's own errors ====


def _operator(
    cluster: LocalCluster, admin: k8s.ApiClient, ns: str, verbs: list[str], name: str = "operator"
) -> str:
    """A user with ``verbs`` on TrainJobs in ``ns`` and nothing else (no create), returned
    once the apiserver's authorizer applies the new binding."""
    user = f"{name}-{ns}"
    rbac = k8s.RbacAuthorizationV1Api(admin)
    rule = {"apiGroups": [TRAINJOB.group], "resources": [TRAINJOB.plural], "verbs": verbs}
    role: Any = {"metadata": {"name": name}, "rules": [rule]}
    rbac.create_namespaced_role(ns, role)
    binding: Any = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    rbac.create_namespaced_role_binding(ns, binding)
    with cluster.api_client(user) as api:
        wait_allowed(api, verbs[0], f"{TRAINJOB.plural}.{TRAINJOB.group}", ns)
    return user


def test_a_missing_trainjob_is_not_found_even_where_hold_is_unsupported(
    cluster: LocalCluster, admin_client: k8s.ApiClient, kc: Cluster
) -> None:
    """Before: the lazy preflight ran first, so a missing TrainJob was reported Unsupported
    (the round trip needs create, which this operator lacks)."""
    user = _operator(cluster, admin_client, kc.ns, ["get", "patch"])
    kc.create_trainjob("job")
    with cluster.api_client(user) as api, make(cluster, api, "plain") as adapter:
        with pytest.raises(NotFound):
            adapter.hold(Ref(kc.ns, "nope"), meta(1), "r")
        with pytest.raises(NotFound):
            adapter.release(Ref(kc.ns, "nope"), meta(1))
        with pytest.raises(Unsupported, match="hold round trip failed"):
            adapter.hold(Ref(kc.ns, "job"), meta(1), "r")
    assert hold_annotations(kc.trainjob("job")) == {}


def test_access_preflight_needs_no_create_right_and_sends_no_dry_run(
    cluster: LocalCluster, admin_client: k8s.ApiClient, kc: Cluster
) -> None:
    user = _operator(cluster, admin_client, kc.ns, ["get", "patch"])
    kc.create_trainjob("job")
    ref = Ref(kc.ns, "job")
    with cluster.api_client(user) as api, make(cluster, api, "plain", lazy_preflight="access") as a:
        a.hold(ref, meta(1), "r")
        a.release(ref, meta(1))
        verbs = [r.verb for r in a.request_log]
    assert "dry-run-create" not in verbs and verbs.count("access-review") == 1, verbs
    assert hold_annotations(kc.trainjob("job")) == {}
    # Without update, the light check says Unsupported, naming the missing right.
    reader = _operator(cluster, admin_client, kc.ns, ["get"], name="reader")
    with (
        cluster.api_client(reader) as api,
        make(cluster, api, "plain", lazy_preflight="access") as a,
    ):
        with pytest.raises(Unsupported, match="may not patch trainjobs"):
            a.hold(ref, meta(2), "r")
        assert [r.verb for r in a.request_log] == ["get", "access-review"]


def test_preflight_is_cached_per_adapter_and_refreshable(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster
) -> None:
    kc.create_trainjob("job")
    ref = Ref(kc.ns, "job")
    with make(cluster, supervisor_client, "plain") as adapter:

        def dry_runs() -> int:
            return sum(1 for r in adapter.request_log if r.verb == "dry-run-create")

        adapter.hold(ref, meta(1), "r")
        first = dry_runs()
        assert first == 2  # the lazy preflight: round trip + enforcer probe
        cached = adapter.preflight(kc.ns, refresh=False)
        adapter.release(ref, meta(1))
        assert dry_runs() == first  # cached: no probe again
        assert adapter.preflight(kc.ns, refresh=False) is cached
        fresh = adapter.preflight(kc.ns)  # refresh (the default)
        assert fresh is not cached and dry_runs() == 2 * first
        adapter.forget_preflight(kc.ns)
        adapter.hold(ref, meta(2), "r")
        assert dry_runs() == 3 * first  # forgotten: probed again by the next Hold


def test_cli_hold_and_release_run_no_dry_run_create_unless_asked(
    capsys: pytest.CaptureFixture[str],
    cluster: LocalCluster,
    kc: Cluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: every CLI hold ran the full preflight (2 dry-run creates, 3 reviews)."""
    sent: list[str] = []
    original = Context.send

    def recording(self: Context, req: Request, *args: Any, **kwargs: Any) -> Any:
        sent.append(req.verb)
        return original(self, req, *args, **kwargs)

    monkeypatch.setattr(Context, "send", recording)
    config = tmp_path / "holdwarden.yaml"
    config.write_text("mode: plain\nholder: operator\n")
    kc.create_trainjob("job")
    common = ["--kubeconfig", str(cluster.kubeconfig_path), "--config", str(config)]
    ref = f"{kc.ns}/job"
    assert main(["hold", ref, "--instance", "1", *common]) == 0
    assert main(["release", ref, "--instance", "1", *common]) == 0
    assert "dry-run-create" not in sent and sent.count("access-review") == 2, sent
    assert main(["hold", f"{kc.ns}/nope", "--instance", "1", *common]) == NotFound.exit_code
    sent.clear()
    assert main(["hold", ref, "--instance", "2", "--preflight", *common]) == 0
    assert sent.count("dry-run-create") == 2, sent
    capsys.readouterr()


# ==== minimal writes on the wire (items 2 and 3) =======================================


class _Wire:
    """Wraps the adapter's own PoolManager: (method, body bytes) of every request."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sent: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        body = kwargs.get("body")
        self.sent.append((method, len(body) if isinstance(body, (str, bytes)) else 0))
        return self._inner.request(method, url, *args, **kwargs)


@pytest.mark.parametrize("mode", ["kueue", "plain"])
def test_hold_and_release_send_a_small_patch_not_the_whole_object(
    cluster: LocalCluster, supervisor_client: k8s.ApiClient, kc: Cluster, mode: str
) -> None:
    """Before: every write was a PUT of the whole object as read (status, managedFields)."""
    if mode == "kueue":
        ref, wl_name = kc.kueue_job("job")
        for _ in range(5):  # a Workload with some status, as Kueue leaves it
            kc.bump_workload_status(wl_name)
        held: Any = lambda: kc.workload(wl_name)  # noqa: E731
    else:
        kc.create_trainjob("job")
        ref = Ref(kc.ns, "job")
        held = lambda: kc.trainjob("job")  # noqa: E731
    with make(cluster, supervisor_client, mode) as adapter:
        adapter.preflight(kc.ns)
        rest: Any = adapter.api_client.rest_client
        wire = rest.pool_manager = _Wire(rest.pool_manager)
        adapter.hold(ref, meta(1), "r")
        whole = len(json.dumps(held()))
        adapter.release(ref, meta(1))
    writes = [(m, size) for m, size in wire.sent if m not in ("GET", "POST")]
    assert [m for m, _ in writes] == ["PATCH", "PATCH"], wire.sent
    assert all(0 < size < 400 and size * 3 < whole for _, size in writes), (writes, whole)
    assert hold_annotations(held()) == {}
