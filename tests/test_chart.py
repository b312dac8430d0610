"""charts/holdwarden renders the same objects as the kustomize install, for each variant the
chart offers (``helm template`` with the Helm built by ``make binaries``, against the real
kustomize v5.5.0, tests/kustomize.py). The kustomize objects are the ones the real
apiserver accepts strictly (tests/test_manifests_render.py), so equal objects are too.

Two differences are by design: the chart does not create the Namespace (Helm installs into
an existing one: create it with its Pod Security labels first), and the ConfigMap's
config.yaml is compared as the configuration it loads to (the chart writes it from
values, without the manifest's comments).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from holdwarden import __version__
from holdwarden.config import Config
from holdwarden.localcluster.binaries import BinariesUnavailable
from tests.kustomize import render
from tests.tool_binaries import ensure_helm

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "holdwarden"
MANIFESTS = ROOT / "manifests"
NAMESPACE = "holdwarden-system"

# Variant -> (helm --set values, kustomize components).
VARIANTS: dict[str, tuple[list[str], list[Path]]] = {
    "base": ([], []),
    "monitoring": (["monitoring.enabled=true"], [MANIFESTS / "monitoring"]),
    "readmission": (["readmission.enabled=true"], [MANIFESTS / "readmission"]),
    "sidecar": (["sidecar.enabled=true"], [MANIFESTS / "sidecar"]),
    "audit-events": (["auditEvents.enabled=true"], [MANIFESTS / "audit-events"]),
    "sidecar-monitoring": (
        ["sidecar.enabled=true", "monitoring.enabled=true"],
        [MANIFESTS / "sidecar", MANIFESTS / "monitoring"],
    ),
    "defence-in-depth": (
        ["policy.enabled=true", "failurePolicy=Ignore"],
        [MANIFESTS / "defence-in-depth"],
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


def helm_template(helm: Path, values: list[str], tmp: Path) -> list[dict[str, Any]]:
    """``helm template`` offline, with Helm's own state kept in ``tmp``."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
    }
    command = [str(helm), "template", "holdwarden", str(CHART), "--namespace", NAMESPACE,
               "--kube-version", "1.36.3"]  # fmt: skip
    for value in values:
        command += ["--set", value]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def _normalized(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    out: dict[tuple[str, str, str], Any] = {}
    for obj in objs:
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
