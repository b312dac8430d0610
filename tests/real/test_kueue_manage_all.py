"""Kueue configured with ``manageJobsWithoutQueueName: true``, on the real controllers.

Kueue then manages every TrainJob in the namespaces its ``managedJobsNamespaceSelector``
selects, queue-name label or not: its webhook suspends such a TrainJob at creation and its
reconciler makes a Workload for it. holdwarden is configured the same way
(``kueue.manageJobsWithoutQueueName``, ``kueue.managedJobsNamespaceSelector``) and its
second webhook entry is registered with that selector. This cluster is its own (its Kueue
is configured differently from the shared one's, and in Kueue v0.19 the selector also
decides for labelled jobs), started once for this module.

- A person's unsuspend of an unlabelled TrainJob Kueue manages is refused by
  kueue-owns-suspend; the TrainJob is untouched and no pod of it appears. Kueue's own
  suspend changes pass.
- In a namespace the selector does not select, the same write passes: Kueue does not
  manage that TrainJob (the negative control: the refusal above is the namespace's).
- The adapter in Kueue mode starts an unlabelled TrainJob there (Start reads the
  namespace's labels), holds and releases it through its Workload, and preflight reports
  the setting.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from holdwarden.adapter import Adapter, CallMeta, Ref
from holdwarden.adapter.errors import Invalid
from holdwarden.adapter.types import State
from holdwarden.config import Config, KueueConfig
from holdwarden.labelselector import LabelSelector
from holdwarden.vocabulary import QUEUE_NAME_LABEL, TRAINJOB, RuleId
from rig.builders import trainjob_body
from rig.localcluster import EDITOR_USER, KUEUE_IDENTITY, SUPERVISOR_IDENTITY, LocalCluster
from rig.localcluster.controllers import CONTROLLERS
from rig.localcluster.realstory import Objects, eventually
from tests.real.enforcer import Enforcement, enforcement
from tests.real.story import assert_no_false_positives

pytestmark = [pytest.mark.controlplane, pytest.mark.timeout(900)]

SELECTED = "holdwarden.io/kueue-manages-all"
# Kueue's managedJobsNamespaceSelector in this cluster, and holdwarden's copy of it.
SELECTOR = LabelSelector(match_labels=((SELECTED, "true"),))


@pytest.fixture(scope="module")
def queueless_cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(
        controllers=CONTROLLERS,
        kueue_settings={
            "manageJobsWithoutQueueName": True,
            "managedJobsNamespaceSelector": SELECTOR.to_dict(),
        },
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def enforced(
    queueless_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Enforcement]:
    with enforcement(
        queueless_cluster, tmp_path_factory.mktemp("enforcer"), queueless=SELECTOR
    ) as running:
        yield running


def _namespace(cluster: LocalCluster, enforced: Enforcement, prefix: str, selected: bool) -> str:
    labels = enforced.labels() | ({SELECTED: "true"} if selected else {})
    return cluster.create_namespace(
        f"{prefix}-{enforced.token[:6]}-{int(time.time() * 1000) % 1000000}", labels=labels
    )


def _unsuspend(api: k8s.ApiClient, namespace: str, name: str) -> ApiException | None:
    """A merge patch ``spec.suspend: false``; the ApiException if it is refused."""
    try:
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
            TRAINJOB.group,
            TRAINJOB.version,
            namespace,
            TRAINJOB.plural,
            name,
            {"spec": {"suspend": False}},
        )
    except ApiException as exc:
        return exc
    return None


def _meta(instance: int | None = None) -> CallMeta:
    return CallMeta(datetime.now(UTC) + timedelta(seconds=60), instance)


def test_a_persons_unsuspend_of_a_queueless_trainjob_kueue_manages_is_refused(
    queueless_cluster: LocalCluster, enforced: Enforcement
) -> None:
    cluster = queueless_cluster
    namespace = _namespace(cluster, enforced, "qless", selected=True)
    with cluster.api_client() as admin, cluster.api_client(EDITOR_USER) as alice:
        objects = Objects(admin, namespace)
        # Created by a person, unlabelled, not suspended: Kueue's webhook suspends it and
        # its reconciler makes a Workload for it (Kueue manages it).
        k8s.CustomObjectsApi(alice).create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural,
            trainjob_body("job", suspend=False),
        )  # fmt: skip
        assert objects.suspended(), "Kueue's webhook did not suspend the queueless TrainJob"
        eventually(objects.workload, "Kueue's Workload for the queueless TrainJob")
        before = objects.trainjob()["metadata"]["resourceVersion"]

        refused = _unsuspend(alice, namespace, "job")
        assert refused is not None and refused.status == 403, refused
        assert RuleId.KUEUE_OWNS_SUSPEND in str(refused.body)
        assert f"namespace '{namespace}' is one Kueue's managedJobsNamespaceSelector" in str(
            refused.body
        )
        # Untouched, and nothing runs: Trainer makes no JobSet for a suspended TrainJob.
        assert objects.trainjob()["metadata"]["resourceVersion"] == before
        assert objects.suspended()
        assert objects.pods() == []
        records = [r for r in enforced.audit() if r.get("namespace") == namespace]
        assert [r["rule"] for r in records] == [str(RuleId.KUEUE_OWNS_SUSPEND)]

        # Kueue itself may change it (the same write as Kueue's identity passes the
        # enforcer; a dry run, so the job stays suspended for the assertions below).
        with cluster.api_client(KUEUE_IDENTITY) as kueue:
            k8s.CustomObjectsApi(kueue).patch_namespaced_custom_object(
                TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural, "job",
                {"spec": {"suspend": False}}, dry_run="All",
            )  # fmt: skip
        assert objects.pods() == []
    assert_no_false_positives(cluster, enforced)


def test_where_kueue_does_not_manage_queueless_trainjobs_the_write_passes(
    queueless_cluster: LocalCluster, enforced: Enforcement
) -> None:
    cluster = queueless_cluster
    namespace = _namespace(cluster, enforced, "notsel", selected=False)
    with cluster.api_client() as admin, cluster.api_client(EDITOR_USER) as alice:
        objects = Objects(admin, namespace)
        k8s.CustomObjectsApi(alice).create_namespaced_custom_object(
            TRAINJOB.group, TRAINJOB.version, namespace, TRAINJOB.plural,
            trainjob_body("job", suspend=True),
        )  # fmt: skip
        assert _unsuspend(alice, namespace, "job") is None
        assert not objects.suspended()
        # Kueue leaves it alone: no Workload, and Trainer runs it (the JobSet's pods).
        eventually(objects.pods, "pods of the TrainJob Kueue does not manage")
        assert objects.workload() is None


def test_the_adapter_starts_holds_and_releases_a_queueless_trainjob(
    queueless_cluster: LocalCluster, enforced: Enforcement
) -> None:
    cluster = queueless_cluster
    namespace = _namespace(cluster, enforced, "adapt", selected=True)
    config = Config(
        mode="kueue",
        kueue=KueueConfig(
            manage_jobs_without_queue_name=True,
            managed_jobs_namespace_selector=SELECTOR,
        ),
    )
    with cluster.api_client() as admin, cluster.api_client(SUPERVISOR_IDENTITY) as supervisor:
        objects = Objects(admin, namespace)
        adapter = Adapter(config, supervisor)
        ref = adapter.start(trainjob_body("job", namespace=namespace), _meta())
        assert ref == Ref(namespace, "job")
        workload = objects.workload()
        assert workload is not None, "Start returned before the Workload existed"
        assert QUEUE_NAME_LABEL not in (objects.trainjob()["metadata"].get("labels") or {})

        result = adapter.preflight(namespace)
        queueless = result.capabilities()["kueueWithoutQueueName"]
        assert queueless.supported, queueless.reason
        assert "here are Kueue's" in queueless.reason
        # A supervisor configured without the setting sees the mismatch: Kueue's Workload
        # of a TrainJob without the queue label (its spec.queueName is empty).
        assert not workload.get("spec", {}).get("queueName")
        unaware = Adapter(Config(mode="kueue"), supervisor).preflight(namespace)
        mismatch = unaware.capabilities()["kueueWithoutQueueName"]
        assert not mismatch.supported
        assert f"{namespace}/job has a Workload with no queue name" in mismatch.reason

        adapter.hold(ref, _meta(1), "lost a node")
        observed = adapter.observe(ref)
        assert observed.state is State.HELD and observed.hold_instance == 1
        held = objects.workload()
        assert held is not None and held["spec"]["active"] is False
        assert objects.suspended()

        adapter.release(ref, _meta(1))
        released = objects.workload()
        assert released is not None and released["spec"].get("active", True) is True
        # No queue: Kueue keeps it suspended, waiting for admission (it never runs here).
        assert adapter.observe(ref).state is not State.HELD
        assert objects.suspended()
        assert objects.pods() == []

    # Plain mode refuses such a namespace at Start: Kueue would own spec.suspend there.
    plain = Config(
        mode="plain",
        kueue=KueueConfig(
            manage_jobs_without_queue_name=True,
            managed_jobs_namespace_selector=SELECTOR,
        ),
    )
    with (
        cluster.api_client(SUPERVISOR_IDENTITY) as supervisor,
        pytest.raises(Invalid, match="Kueue manages every TrainJob in namespace"),
    ):
        Adapter(plain, supervisor).start(trainjob_body("other", namespace=namespace), _meta())
    assert_no_false_positives(cluster, enforced)
