"""Which CRD files the local control plane installs, and which a version refuses.

Below ``cluster.py`` (which installs them) and ``controllers.py`` (which copies the
upstream files out of the Go module cache), so that neither imports the other for them.
"""

from __future__ import annotations

_TEMPLATE_NAMESPACE_RULE = (
    "Trainer's CEL rule reads metadata.namespace of an embedded template, and the CEL "
    "type of an embedded ObjectMeta has no 'namespace' before 1.31: \"undefined field "
    "'namespace'\""
)
CRD_FILES = (
    "trainer.kubeflow.org_trainjobs.yaml",
    "trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "kueue.x-k8s.io_workloads.yaml",
    "kueue.x-k8s.io_admissionchecks.yaml",
    "kueue.x-k8s.io_clusterqueues.yaml",
    "kueue.x-k8s.io_localqueues.yaml",
    "kueue.x-k8s.io_resourceflavors.yaml",
)

# Upstream CRD files that a Kubernetes version of the version matrix refuses, and why. On
# that version the cluster installs the project's minimal CRD (tests/support/crds) in their
# place and says so in ``crd_kind``: the API floor runs holdwarden's own APIs on the CRDs it
# accepts, and a full Kueue/Trainer stack cannot be installed there.
REFUSED_CRDS: dict[str, dict[str, str]] = {
    "v1.30.14": {
        "trainer.kubeflow.org_clustertrainingruntimes.yaml": _TEMPLATE_NAMESPACE_RULE,
        "trainer.kubeflow.org_trainingruntimes.yaml": _TEMPLATE_NAMESPACE_RULE,
    },
}
