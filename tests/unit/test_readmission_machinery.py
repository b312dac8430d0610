"""The gate's controller machinery without a cluster: the work queue's guarantees, the
store's indexes, lease timing rules and the readmission.* configuration keys."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from holdwarden.config import Config, ConfigError
from holdwarden.leaderelection import ElectionTiming, LeaseElector, pod_namespace
from holdwarden.readmission.informer import Store
from holdwarden.readmission.workqueue import WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_queue_deduplicates_and_never_hands_one_key_to_two_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert queue.depth() == 2
    assert queue.get(0) == "a"
    queue.add("a")  # while "a" is processed: remembered, not handed out
    assert queue.get(0) == "b"
    assert queue.get(0) is None
    queue.done("a")
    assert queue.get(0) == "a"  # back after done, once
    queue.done("a")
    queue.done("b")
    assert queue.idle()


def test_queue_rate_limits_with_exponential_backoff_and_forget_resets_it() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=4.0, clock=clock)
    delays = []
    for _ in range(4):
        queue.add_rate_limited("k")
        start = clock.now
        while queue.get(0) is None:
            clock.now += 0.5
        queue.done("k")
        delays.append(clock.now - start)
    assert delays == [1.0, 2.0, 4.0, 4.0]  # doubling, capped
    queue.forget("k")
    assert queue.failures("k") == 0


def test_queue_shutdown_wakes_a_waiting_worker() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get(30)))
    worker.start()
    queue.shutdown()
    worker.join(5)
    assert not worker.is_alive() and got == [None]
    queue.add("late")
    assert queue.depth() == 0


def _obj(name: str, owner: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv}, "owner": owner}


def test_store_indexes_follow_updates_deletes_and_replace() -> None:
    store = Store({"owner": lambda o: [o["owner"]]})
    store.upsert(_obj("w1", "job-a"))
    store.upsert(_obj("w2", "job-a"))
    assert store.count_by_index("owner", "job-a") == 2
    store.upsert(_obj("w2", "job-b", rv="2"))
    assert store.count_by_index("owner", "job-a") == 1
    assert [o["metadata"]["name"] for o in store.by_index("owner", "job-b")] == ["w2"]
    store.delete("ns/w1")
    assert store.count_by_index("owner", "job-a") == 0
    changes = store.replace([_obj("w2", "job-b", rv="2"), _obj("w3", "job-c")])
    # w2 unchanged (same resourceVersion) is not reported; w3 is new.
    assert [(old, new["metadata"]["name"] if new else None) for old, new in changes] == [
        (None, "w3")
    ]
    changes = store.replace([])
    assert sorted(old["metadata"]["name"] for old, _ in changes if old) == ["w2", "w3"]
    assert len(store) == 0


def test_election_timing_follows_client_go_rules() -> None:
    ElectionTiming(lease_duration=3, renew_deadline=2, retry_period=0.5)
    for bad in (
        {"lease_duration": 2, "renew_deadline": 2, "retry_period": 0.5},
        {"lease_duration": 3, "renew_deadline": 0.5, "retry_period": 0.5},
        {"lease_duration": 3, "renew_deadline": 2, "retry_period": 0},
    ):
        with pytest.raises(ValueError):
            ElectionTiming(**bad)


def test_leadership_lapses_at_the_renew_deadline_without_a_request() -> None:
    """is_leader is a matter of time since the last successful renewal: an elector whose
    renewals stop (a hung apiserver) stops acting before its Lease can expire for others."""
    clock = FakeClock()
    elector = LeaseElector(
        None,  # type: ignore[arg-type]  # no request is made in this test
        namespace="ns",
        name="lease",
        timing=ElectionTiming(lease_duration=3, renew_deadline=2, retry_period=0.5),
        clock=clock,
    )
    assert not elector.is_leader()
    spec = type(
        "Spec",
        (),
        {
            k: None
            for k in (
                "holder_identity",
                "lease_duration_seconds",
                "renew_time",
                "acquire_time",
                "lease_transitions",
            )
        },
    )
    elector._won(clock.now, type("Lease", (), {"spec": spec})())  # fmt: skip
    assert elector.is_leader()
    clock.now += 1.9
    assert elector.is_leader()
    clock.now += 0.2
    assert not elector.is_leader()


def test_pod_namespace_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "holdwarden-system")
    assert pod_namespace() == "holdwarden-system"
    monkeypatch.delenv("POD_NAMESPACE")
    assert pod_namespace(fallback="elsewhere") in ("elsewhere", pod_namespace())


def test_readmission_lease_keys_parse_and_are_checked() -> None:
    config = Config.from_dict(
        {
            "readmission": {
                "enabled": True,
                "leaseName": "gate",
                "leaseNamespace": "ops",
                "leaseDuration": "20s",
                "renewDeadline": "15s",
                "retryPeriod": "3s",
                "watchTimeout": "10m",
                "leaderElection": False,
            }
        }
    )
    gate = config.readmission
    assert (gate.lease_name, gate.lease_namespace, gate.leader_election) == ("gate", "ops", False)
    assert gate.lease_duration == timedelta(seconds=20)
    assert gate.renew_deadline == timedelta(seconds=15)
    assert gate.retry_period == timedelta(seconds=3)
    assert gate.watch_timeout == timedelta(minutes=10)
    defaults = Config().readmission
    assert defaults.interval == timedelta(seconds=30) and defaults.leader_election is True
    for bad, key in (
        ({"leaseDuration": "10s"}, "readmission.leaseDuration"),
        ({"renewDeadline": "2s"}, "readmission.renewDeadline"),
        ({"retryPeriod": "0s"}, "readmission.retryPeriod"),
        ({"leaseName": ""}, "readmission.leaseName"),
        ({"watchTimeout": "0s"}, "readmission.watchTimeout"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            Config.from_dict({"readmission": bad})
