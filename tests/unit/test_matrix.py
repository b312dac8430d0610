"""The version matrix's machinery, without building or starting anything: which versions a
cell selects, that today's cell keeps its cache keys, the CRDs the API floor accepts, and
how a cell's JUnit report becomes its table rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rig.localcluster import binaries
from rig.localcluster.binaries import (
    COMPONENTS,
    DEFAULT_CELL,
    KUBERNETES_VERSION_ENV,
    KUEUE_VERSION_ENV,
    TRAINER_VERSION_ENV,
    BinariesUnavailable,
    Cell,
    components,
    controller_binary_path,
    kube_apiserver_path,
    selected_cell,
)
from rig.localcluster.cluster import accepted_crd_dir
from rig.localcluster.crds import CRD_FILES, REFUSED_CRDS
from rig.localcluster.matrix import CELLS, CellResult, cell_environment, read_junit, table

REPO = Path(__file__).resolve().parents[2]
_ENVS = (KUBERNETES_VERSION_ENV, KUEUE_VERSION_ENV, TRAINER_VERSION_ENV)


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in _ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOLDWARDEN_CACHE", str(tmp_path / "cache"))


def test_todays_cell_keeps_its_binaries_and_cache_keys(tmp_path: Path) -> None:
    assert selected_cell() == DEFAULT_CELL == Cell("v1.36.3", "v0.19.2", "v2.3.0")
    assert components() == COMPONENTS
    cache = tmp_path / "cache"
    assert kube_apiserver_path() == cache / "kube-apiserver-v1.36.3" / "kube-apiserver"
    for name, component in COMPONENTS.items():
        # The historical folders under controllerbuild/, so the same go.sum hashes.
        assert component.module in {
            "kueue",
            "trainer",
            "jobset",
            "kcm",
            "scheduler",
            "kwok",
            "node",
            "coredns",
        }
        assert controller_binary_path(component).parent.name.startswith(
            f"{component.binary}-{component.version}-"
        ), name


def test_a_cell_is_chosen_by_environment_and_builds_from_its_own_modules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(KUBERNETES_VERSION_ENV, "v1.37.2")
    monkeypatch.setenv(KUEUE_VERSION_ENV, "v0.17.0")
    monkeypatch.setenv(TRAINER_VERSION_ENV, "v2.2.1")
    cell = selected_cell()
    assert cell == Cell("v1.37.2", "v0.17.0", "v2.2.1") and not cell.default_controllers
    found = components()
    assert found["kueue"].module == "kueue-v0.17.0" and found["kueue"].version == "v0.17.0"
    assert "GitVersion=v0.17.0" in found["kueue"].ldflags
    assert found["trainer"].module == "trainer-v2.2.1"
    assert found["kube-controller-manager"].module == "kcm-v1.37.2"
    assert "gitVersion=v1.37.2" in found["kube-scheduler"].ldflags
    assert found["jobset"] == COMPONENTS["jobset"] and found["kwok"] == COMPONENTS["kwok"]
    # Another version's kube-apiserver folder names its go.sum's hash as well.
    path = kube_apiserver_path()
    assert path.parent.name.startswith("kube-apiserver-v1.37.2-")
    assert path.parent.parent == tmp_path / "cache"
    for module in ("kueue-v0.17.0", "trainer-v2.2.1", "kcm-v1.37.2", "scheduler-v1.37.2"):
        folder = REPO / "rig" / "localcluster" / "controllerbuild" / module
        assert (folder / "go.sum").read_text(), f"{module}: go.sum is empty"
    for version in ("v1.30.14", "v1.37.2"):
        go_mod = (REPO / "rig" / "localcluster" / "kubebuild" / version / "go.mod").read_text()
        minor = version.split(".")[1]
        assert f"require k8s.io/kubernetes {version}" in go_mod
        # Every staging module replaced by its published version of the same minor.
        assert f"k8s.io/client-go => k8s.io/client-go v0.{minor}." in go_mod


def test_the_api_floor_has_no_controller_modules_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KUBERNETES_VERSION_ENV, "v1.30.14")
    assert "kube-controller-manager" not in components()
    with pytest.raises(BinariesUnavailable, match="CRDs only"):
        binaries.controller_binaries(("kube-controller-manager",), log=False)


def test_an_unknown_version_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KUEUE_VERSION_ENV, "v0.20.0")
    with pytest.raises(BinariesUnavailable, match=r"HOLDWARDEN_KUEUE_VERSION=v0\.20\.0"):
        selected_cell()


def test_the_floor_installs_the_minimal_crd_for_each_one_it_refuses(tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    for name in CRD_FILES:
        (upstream / name).write_text(f"# upstream {name}\n")
    refused = REFUSED_CRDS["v1.30.14"]
    folder = accepted_crd_dir(upstream, refused, "v1.30.14")
    for name in CRD_FILES:
        text = (folder / name).read_text()
        if name in refused:
            assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition", name
            assert text == (REPO / "tests" / "support" / "crds" / name).read_text()
        else:
            assert text == f"# upstream {name}\n"


def test_a_cell_environment_names_its_versions_and_drops_other_binaries() -> None:
    floor = {c.name: c for c in CELLS}["floor"]
    env = cell_environment(
        floor.cell, {"KUBEBUILDER_ASSETS": "/x", "HOLDWARDEN_CRDS": "/y", "PATH": "/bin"}
    )
    assert env == {
        "PATH": "/bin",
        KUBERNETES_VERSION_ENV: "v1.30.14",
        KUEUE_VERSION_ENV: "v0.19.2",
        TRAINER_VERSION_ENV: "v2.3.0",
    }


def test_a_junit_report_becomes_rows_with_each_failure_named(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<?xml version="1.0"?><testsuites><testsuite>'
        '<testcase classname="tests.real.test_plain_mode" name="test_a" time="12.5"/>'
        '<testcase classname="tests.real.test_kueue_mode" name="test_b[x]" time="3">'
        '<failure message="AssertionError: no pod&#10;second line">trace</failure></testcase>'
        '<testcase classname="tests.t" name="test_c" time="0">'
        '<skipped message="why"/></testcase>'
        "</testsuite></testsuites>"
    )
    cases = read_junit(report)
    assert [(c.case, c.outcome, c.message) for c in cases] == [
        ("test_plain_mode::test_a", "passed", ""),
        ("test_kueue_mode::test_b[x]", "failed", "AssertionError: no pod"),
        ("t::test_c", "skipped", "why"),
    ]
    result = CellResult("today", DEFAULT_CELL.describe(), 1.0, 2.0, "", 1, cases)
    assert not result.passed  # a skip or a failure is never a pass
    rendered = table([result, CellResult("newest", "v1.37.2", build_error="go build failed")])
    assert "| today | Kubernetes v1.36.3, Kueue v0.19.2, Trainer v2.3.0 |" in rendered
    assert "FAIL: 1 failed, 1 passed, 1 skipped" in rendered
    assert "| newest | v1.37.2 | 0s | 0s | FAIL: not run: go build failed |" in rendered
    assert "| today | test_kueue_mode::test_b[x] | failed | 3 | AssertionError: no pod |" in (
        rendered
    )
