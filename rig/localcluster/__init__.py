"""A real local control plane (etcd + kube-apiserver) for the tests and the demo."""

from rig.localcluster.binaries import Binaries, BinariesUnavailable, ensure_binaries
from rig.localcluster.cluster import LocalCluster, running_cluster
from rig.localcluster.errors import ControlPlaneError
from rig.localcluster.rbac import (
    EDITOR_USER,
    ENFORCER_IDENTITY,
    GATE_IDENTITY,
    JOB_CONTROLLER_IDENTITY,
    KUEUE_IDENTITY,
    SUPERVISOR_IDENTITY,
    TRAINER_IDENTITY,
    UNPRIVILEGED_USER,
)

__all__ = [
    "EDITOR_USER",
    "ENFORCER_IDENTITY",
    "GATE_IDENTITY",
    "JOB_CONTROLLER_IDENTITY",
    "KUEUE_IDENTITY",
    "SUPERVISOR_IDENTITY",
    "TRAINER_IDENTITY",
    "UNPRIVILEGED_USER",
    "Binaries",
    "BinariesUnavailable",
    "ControlPlaneError",
    "LocalCluster",
    "ensure_binaries",
    "running_cluster",
]
