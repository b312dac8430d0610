"""charts/holdwarden renders the same objects as the kustomize install, for each variant the
chart offers (``helm template`` with the Helm built by ``make binaries``, against the real
kustomize v5.5.0, tests/support/kustomize.py). The kustomize objects are the ones the real
apiserver accepts strictly (tests/controlplane/test_manifests_render.py), so equal objects are too.

Three differences are by design: the chart does not create the Namespace (Helm installs into
an existing one, or ``--create-namespace``: label it for Pod Security), the ConfigMap's
config.yaml is compared as the configuration it loads to (the chart writes it from
values, without the manifest's comments), and the chart's ``helm test`` Pod (a hook) has
no kustomize twin. The values schema (values.schema.json) is checked with the real Helm:
a bad value is refused with a message naming the field.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from holdwarden import __version__
from holdwarden.config import Config
from holdwarden.webhook import selftest
from rig.localcluster.binaries import BinariesUnavailable
from tests.support.kustomize import render, unhashed
from tests.support.tool_binaries import ensure_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "holdwarden"
MANIFESTS = ROOT / "manifests"
NAMESPACE = "holdwarden-system"

PROVIDED = "certificates.mode=provided"
CERT_MANAGER = "certificates.mode=cert-manager"
# Variant -> (helm --set values, kustomize components). The certificate modes: the chart's
# certificates.mode self-managed (the default) is the base, provided is the component
# manifests/provided, cert-manager is manifests/cert-manager. The sidecar's enforcer serves
# a mounted Secret, so it goes with provided (or cert-manager) certificates.
VARIANTS: dict[str, tuple[list[str], list[Path]]] = {
    "base": ([], []),
    "provided": ([PROVIDED], [MANIFESTS / "provided"]),
    "cert-manager": ([CERT_MANAGER], [MANIFESTS / "cert-manager"]),
    "monitoring": (["monitoring.enabled=true"], [MANIFESTS / "monitoring"]),
    "readmission": (["readmission.enabled=true"], [MANIFESTS / "readmission"]),
    "readmission-provided": (
        ["readmission.enabled=true", PROVIDED],
        [MANIFESTS / "readmission", MANIFESTS / "provided"],
    ),
    "sidecar": (
        ["sidecar.enabled=true", PROVIDED],
        [MANIFESTS / "sidecar", MANIFESTS / "provided"],
    ),
    "sidecar-cert-manager": (
        ["sidecar.enabled=true", CERT_MANAGER],
        [MANIFESTS / "sidecar", MANIFESTS / "cert-manager"],
    ),
    "audit-events": (["auditEvents.enabled=true"], [MANIFESTS / "audit-events"]),
    "audit-events-cert-manager": (
        ["auditEvents.enabled=true", CERT_MANAGER],
        [MANIFESTS / "audit-events", MANIFESTS / "cert-manager"],
    ),
    "sidecar-monitoring": (
        ["sidecar.enabled=true", "monitoring.enabled=true", PROVIDED],
        [MANIFESTS / "sidecar", MANIFESTS / "monitoring", MANIFESTS / "provided"],
    ),
    "defence-in-depth": (
        ["policy.enabled=true", "failurePolicy=Ignore"],
        [MANIFESTS / "defence-in-depth"],
    ),
    "defence-in-depth-cert-manager": (
        ["policy.enabled=true", "failurePolicy=Ignore", CERT_MANAGER],
        [MANIFESTS / "defence-in-depth", MANIFESTS / "cert-manager"],
    ),
    "kueue-manage-all": (
        ["config.kueue.manageJobsWithoutQueueName=true"],
        [MANIFESTS / "kueue-manage-all"],
    ),
    "both": (
        ["monitoring.enabled=true", "readmission.enabled=true"],
        [MANIFESTS / "monitoring", MANIFESTS / "readmission"],
    ),
}


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return ensure_helm(log=False)
    except BinariesUnavailable as exc:
        pytest.fail(f"helm is needed (make binaries builds it): {exc}")


def helm_run(helm: Path, args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` offline, with Helm's own state kept in ``tmp``."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
    }
    return subprocess.run([str(helm), *args], env=env, capture_output=True, text=True, timeout=60)


def helm_template(
    helm: Path, values: list[str], tmp: Path, *, hooks: bool = False
) -> list[dict[str, Any]]:
    """``helm template`` offline; the objects, without hooks unless ``hooks``."""
    command = ["template", "holdwarden", str(CHART), "--namespace", NAMESPACE,
               "--kube-version", "1.36.3"]  # fmt: skip
    for value in values:
        command += ["--set", value]
    result = helm_run(helm, command, tmp)
    assert result.returncode == 0, result.stderr
    objs = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    if hooks:
        return objs
    return [o for o in objs if "helm.sh/hook" not in o["metadata"].get("annotations", {})]


def _normalized(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """Keyed by kind, namespace and name; the configuration parsed; the ConfigMap's
    generated name unhashed and the chart's checksum annotation dropped (each is how one
    tool rolls the Pods when the configuration changes; test_a_changed_configuration_rolls
    checks both)."""
    out: dict[tuple[str, str, str], Any] = {}
    for obj in unhashed(objs):
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        annotations = template.get("annotations", {})
        annotations.pop("checksum/config", None)
        if "annotations" in template and not annotations:
            del template["annotations"]
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, key
        if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
            obj = {**obj, "data": {**obj["data"]}}
            obj["data"]["config.yaml"] = Config.from_dict(
                yaml.safe_load(obj["data"]["config.yaml"])
            )
        out[key] = obj
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chart_renders_the_kustomize_objects(helm: Path, tmp_path: Path, variant: str) -> None:
    values, components = VARIANTS[variant]
    from_helm = _normalized(helm_template(helm, values, tmp_path))
    from_kustomize = _normalized(
        [o for o in render(MANIFESTS, components) if o["kind"] != "Namespace"]
    )
    assert sorted(from_helm) == sorted(from_kustomize)
    for key, obj in from_kustomize.items():
        assert from_helm[key] == obj, key


def test_chart_values_are_documented_and_versioned() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "holdwarden"
    assert chart["appVersion"] == __version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The default configuration loads (unknown keys and bad values are errors).
    Config.from_dict(values["config"])
    for optional in ("readmission", "monitoring", "sidecar", "auditEvents"):
        assert values[optional]["enabled"] is False, optional
    assert values["certificates"] == {"mode": "self-managed"}
    assert values["failurePolicy"] == "Fail"


# (--set value, what Helm's message must name): the schema refuses each.
BAD_VALUES = [
    ("certificates.mode=selfmanaged", "/certificates/mode"),
    ("certificates.mode=", "/certificates/mode"),
    ("failurePolicy=Never", "/failurePolicy"),
    ("replicaCount=0", "/replicaCount"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("readmission.interval=soon", "/readmission/interval"),
    ("monitoring.enabled=yes", "/monitoring/enabled"),
    ("certificates.issuer=x", "issuer"),
    ("replicas=3", "replicas"),
    # The configuration's part is generated from holdwarden/config.py (rig/configschema.py).
    ("config.mode=kube", "/config/mode"),
    ("config.webhook.maxBodyBytes=10", "/config/webhook/maxBodyBytes"),
    ("config.webhook.shutdownDelay=soon", "/config/webhook/shutdownDelay"),
    ("config.kueue.identitys=x", "identitys"),
    ("readmission.interval=1d", "/readmission/interval"),
]


@pytest.mark.parametrize(("value", "field"), BAD_VALUES)
def test_the_values_schema_refuses_bad_values_naming_the_field(
    helm: Path, tmp_path: Path, value: str, field: str
) -> None:
    for verb in (["lint", str(CHART)], ["template", "holdwarden", str(CHART)]):
        result = helm_run(helm, [*verb, "--kube-version", "1.36.3", "--set", value], tmp_path)
        assert result.returncode != 0, (verb, value, result.stdout[-500:])
        text = result.stdout + result.stderr
        assert field in text, (verb, value, text[-800:])


def test_the_values_schema_accepts_every_documented_mode(helm: Path, tmp_path: Path) -> None:
    for mode in ("self-managed", "cert-manager", "provided"):
        args = [
            "lint",
            str(CHART),
            "--kube-version",
            "1.36.3",
            "--set",
            f"certificates.mode={mode}",
        ]
        result = helm_run(helm, args, tmp_path)
        assert result.returncode == 0, (mode, result.stdout[-800:], result.stderr[-800:])


def test_the_sidecar_with_self_managed_certificates_is_refused(helm: Path, tmp_path: Path) -> None:
    args = ["template", "holdwarden", str(CHART), "--kube-version", "1.36.3",
            "--set", "sidecar.enabled=true"]  # fmt: skip
    result = helm_run(helm, args, tmp_path)
    assert result.returncode != 0
    assert "certificates.mode" in result.stderr and "sidecar.enabled" in result.stderr


@pytest.mark.parametrize(
    ("mode", "secret"),
    [
        ("self-managed", "holdwarden-certificates"),
        ("provided", "holdwarden-webhook-tls"),
        ("cert-manager", "holdwarden-webhook-tls"),
    ],
)
def test_the_helm_test_pod_sends_one_review_trusting_the_webhooks_ca(
    helm: Path, tmp_path: Path, mode: str, secret: str
) -> None:
    """The hook's rendered Pod: runs holdwarden.webhook.selftest against the Service with only the
    CA (not the CA key) of the mode's Secret, no token, and passes the namespace's
    restricted Pod Security (the settings the enforcer's own Pod has).
    (tests/controlplane/test_install_onestep.py runs the same command against a real enforcer.)"""
    objs = helm_template(helm, [f"certificates.mode={mode}"], tmp_path, hooks=True)
    (pod,) = [o for o in objs if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    command = container["command"]
    assert command[:3] == ["python3", "-m", "holdwarden.webhook.selftest"]
    assert command[command.index("--url") + 1] == f"https://holdwarden.{NAMESPACE}.svc:443/validate"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["ca"]["secret"]["secretName"] == secret
    assert volumes["ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    ca_file = command[command.index("--ca-file") + 1]
    assert mounts[str(Path(ca_file).parent)] == "ca"
    # The arguments parse as the module's own.
    assert command[3:].count("--url") == 1
    assert selftest.RULE == "held-trainjob-suspended"


def test_notes_name_the_mode_and_the_next_step(helm: Path, tmp_path: Path) -> None:
    """NOTES.txt as Helm renders it for each mode. (``helm template`` does not print NOTES
    and ``helm install --dry-run`` wants a cluster: a copy of the chart carries the same
    text as a template of its own, a YAML block, which ``helm template`` renders.)"""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    lines = (CHART / "templates" / "NOTES.txt").read_text().splitlines()
    block = ["notes: |", *(line if line.startswith("{{-") else f"  {line}" for line in lines)]
    (chart / "templates" / "notes-rendered.yaml").write_text("\n".join(block) + "\n")
    for mode, needle in (
        ("self-managed", "Nothing else to do"),
        ("cert-manager", "holdwarden certs enforce"),
        ("provided", "holdwarden certs inject"),
    ):
        args = ["template", "holdwarden", str(chart), "--namespace", NAMESPACE,
                "--kube-version", "1.36.3", "--show-only", "templates/notes-rendered.yaml",
                "--set", f"certificates.mode={mode}"]  # fmt: skip
        result = helm_run(helm, args, tmp_path)
        assert result.returncode == 0, result.stderr
        notes = yaml.safe_load(result.stdout)["notes"]
        assert f"(certificates: {mode})" in notes and needle in notes, (mode, notes)


def test_a_changed_configuration_rolls(helm: Path, tmp_path: Path) -> None:
    """The Pods read the configuration at start, so a changed one must change their
    template: the chart's checksum annotation, kustomize's hash-suffixed ConfigMap (an
    overlay's patch of ``holdwarden-config`` included). tests/pods checks it on real Pods."""

    def checksum(values: list[str]) -> str:
        (deployment,) = [
            o for o in helm_template(helm, values, tmp_path) if o["kind"] == "Deployment"
        ]
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum([]) != checksum(["config.webhook.shutdownDelay=6s"])

    def volume(objs: list[dict[str, Any]]) -> str:
        (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        (configmap,) = [o for o in objs if o["kind"] == "ConfigMap"]
        assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
        return str(configmap["metadata"]["name"])

    shipped = volume(render(MANIFESTS))
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = next(o for o in render(MANIFESTS) if o["kind"] == "ConfigMap")
    changed = base["data"]["config.yaml"].replace("shutdownDelay: 5s", "shutdownDelay: 6s")
    assert changed != base["data"]["config.yaml"]
    patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "holdwarden-config", "namespace": NAMESPACE},
        "data": {"config.yaml": changed},
    }
    (overlay / "configmap.yaml").write_text(yaml.safe_dump(patch))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS, overlay)],
        "patches": [{"path": "configmap.yaml"}],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    patched = volume(render(overlay))
    assert shipped.startswith("holdwarden-config-") and patched.startswith("holdwarden-config-")
    assert shipped != patched


@pytest.mark.parametrize(
    ("values", "grace"),
    [
        ([], 30),
        (["config.webhook.shutdownDelay=6s"], 31),
        (["config.webhook.drainTimeout=1m30s", "config.webhook.shutdownDelay=250ms"], 101),
        # Keys left out: the server's defaults, which the template must also assume.
        (["config.webhook.shutdownDelay=null", "config.webhook.drainTimeout=null"], 30),
        (["certificates.mode=provided", "sidecar.enabled=true",
          "sidecar.supervisorImage=supervisor:1", "config.webhook.drainTimeout=40s"], 55),
    ],
    ids=["defaults", "delay-6s", "drain-1m30s", "keys-left-out", "sidecar"],
)  # fmt: skip
def test_the_grace_period_covers_the_pre_stop_the_delay_and_the_drain(
    helm: Path, tmp_path: Path, values: list[str], grace: int
) -> None:
    """A Pod killed mid-drain fails the reviews it still holds: whatever the shutdown delay
    and drain timeout, the enforcer Pod's grace period covers preStop, then the delay, at
    most the drain and 5 s to exit, as the server reads them from the rendered ConfigMap."""
    objs = helm_template(helm, values, tmp_path)
    (configmap,) = [o for o in objs if o["kind"] == "ConfigMap"]
    hook = Config.from_dict(yaml.safe_load(configmap["data"]["config.yaml"])).webhook
    (pod,) = [
        o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] == "Deployment"
        and any(c["name"] == "enforcer" for c in o["spec"]["template"]["spec"]["containers"])
    ]
    (enforcer,) = [c for c in pod["containers"] if c["name"] == "enforcer"]
    sleep = float(enforcer["lifecycle"]["preStop"]["sleep"]["seconds"])
    needed = sleep + hook.shutdown_delay.total_seconds() + hook.drain_timeout.total_seconds() + 5
    assert pod["terminationGracePeriodSeconds"] == grace
    assert needed <= grace < needed + 1, (needed, grace)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ([], "/config/webhook/drainTimeout"),  # the values schema refuses it first
        # Without the schema (a user may skip it), the template's own guard still names it.
        (["--skip-schema-validation"], "config.webhook.drainTimeout"),
    ],
    ids=["schema", "template"],
)
def test_a_duration_the_grace_period_cannot_read_is_refused_naming_it(
    helm: Path, tmp_path: Path, extra: list[str], named: str
) -> None:
    args = ["template", "holdwarden", str(CHART), "--kube-version", "1.36.3", *extra,
            "--set", "config.webhook.drainTimeout=soon"]  # fmt: skip
    result = helm_run(helm, args, tmp_path)
    assert result.returncode != 0, result.stdout[-500:]
    assert named in result.stderr, result.stderr


@pytest.mark.parametrize(
    "values",
    [["readmission.enabled=true"],
     ["certificates.mode=provided", "sidecar.enabled=true", "sidecar.supervisorImage=s:1"]],
    ids=["enforcer-and-gate", "sidecar"],
)  # fmt: skip
def test_every_probe_waits_5_s_for_an_answer(helm: Path, tmp_path: Path, values: list[str]) -> None:
    """As the kustomize manifests (tests/controlplane/test_manifests.py): a probe catches a
    hung process, not a busy node."""
    pods = [
        o["spec"]["template"]["spec"]
        for o in helm_template(helm, values, tmp_path)
        if o["kind"] in ("Deployment", "StatefulSet")
    ]
    probes = [
        (c["name"], kind, c[kind])
        for p in pods
        for c in p["containers"]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
        if kind in c
    ]
    assert len(probes) >= 3, values
    assert all(probe.get("timeoutSeconds", 1) >= 5 for *_, probe in probes), probes
