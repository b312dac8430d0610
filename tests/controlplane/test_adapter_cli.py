"""``holdwarden hold|release|open|status|preflight`` against the real local control plane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client as k8s

from holdwarden.adapter.errors import NotFound, StaleHold
from holdwarden.cli import main
from holdwarden.vocabulary import TRAINJOB, Annotations
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster

A = Annotations("holdwarden.io")


@pytest.fixture
def plain_config(tmp_path: Path) -> Path:
    path = tmp_path / "holdwarden.yaml"
    path.write_text("mode: plain\nholder: operator\ntimeouts:\n  apiserverRequest: 60s\n")
    return path


def run(
    capsys: pytest.CaptureFixture[str], cluster: LocalCluster, config: Path, *argv: str
) -> tuple[int, str, str]:
    code = main([*argv, "--kubeconfig", str(cluster.kubeconfig_path), "--config", str(config)])
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["hold", "a/b/c", "--instance", "1"])
    assert raised.value.code == 2
    assert "expected NAMESPACE/NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        main(["release", "ns/job"])
    assert raised.value.code == 2
    assert "--instance" in capsys.readouterr().err
    for bad in (["--instance", "0"], ["--instance", "1", "--timeout", "soon"]):
        with pytest.raises(SystemExit) as raised:
            main(["hold", "ns/job", *bad])
        assert raised.value.code == 2


def test_bad_config_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("mode: sideways\n")
    assert main(["status", "ns/job", "--config", str(path)]) == 2
    assert "mode" in capsys.readouterr().err


def test_hold_status_release_round_trip(
    capsys: pytest.CaptureFixture[str],
    cluster: LocalCluster,
    admin_client: k8s.ApiClient,
    namespace: str,
    plain_config: Path,
) -> None:
    k8s.CustomObjectsApi(admin_client).create_namespaced_custom_object(
        TRAINJOB.group,
        TRAINJOB.version,
        namespace,
        TRAINJOB.plural,
        trainjob_body("job", suspend=True),
    )
    ref = f"{namespace}/job"
    code, out, _ = run(capsys, cluster, plain_config, "status", ref)
    assert code == 0 and "at-start-gate" in out
    code, out, _ = run(
        capsys, cluster, plain_config, "hold", ref, "--instance", "3", "--reason", "maintenance"
    )
    assert code == 0 and "held" in out
    code, out, _ = run(capsys, cluster, plain_config, "status", ref, "--json")
    status = json.loads(out)
    assert code == 0
    assert (status["state"], status["holdInstance"], status["heldBy"], status["holdReason"]) == (
        "held",
        3,
        "operator",
        "maintenance",
    )
    code, _, err = run(capsys, cluster, plain_config, "release", ref, "--instance", "2")
    assert code == StaleHold.exit_code == 4
    assert "rejected" in err and "not 2" in err
    code, _, _ = run(capsys, cluster, plain_config, "release", ref, "--instance", "3")
    assert code == 0
    code, out, _ = run(capsys, cluster, plain_config, "open", ref)
    assert code == 0
    code, out, _ = run(capsys, cluster, plain_config, "status", ref, "--json")
    assert json.loads(out)["state"] == "running" and json.loads(out)["attempt"] == 1


def test_missing_trainjob_exits_with_not_found(
    capsys: pytest.CaptureFixture[str], cluster: LocalCluster, namespace: str, plain_config: Path
) -> None:
    code, _, err = run(
        capsys, cluster, plain_config, "hold", f"{namespace}/nope", "--instance", "1"
    )
    assert code == NotFound.exit_code == 5
    assert "not found" in err


def test_preflight_command(
    capsys: pytest.CaptureFixture[str], cluster: LocalCluster, namespace: str, plain_config: Path
) -> None:
    code, out, _ = run(
        capsys, cluster, plain_config, "preflight", "--namespace", namespace, "--json"
    )
    result = json.loads(out)
    assert code == 0
    assert result["holdSupported"] is True
    assert set(result["capabilities"]) >= {
        "holdRoundTrip",
        "updateWorkloads",
        "listPods",
        "enforcerInstalled",
    }
