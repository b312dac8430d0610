"""The CLI's kubectl conventions: help on every flag, kubectl's credential precedence, a
bad kubeconfig named, ``-n``/``--context``, ``-o json|yaml|wide`` on every read command,
distinct not-found / refused / unreachable errors and exit codes (a refused connection at
once), shell completion and the ``kubectl-holdwarden`` plugin. Cluster cases run against
the real local control plane."""

from __future__ import annotations

import argparse
import io
import json
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from holdwarden import kubeclient
from holdwarden.adapter.errors import NotFound, Rejected, Unreachable
from holdwarden.certs.generate import generate_client
from holdwarden.cli import build_parser, kubectl_main, main
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]


def _actions(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            found.append((path, action))
    return found


def test_every_flag_and_argument_has_help() -> None:
    missing = [
        f"{path}: {action.option_strings or action.dest}"
        for path, action in _actions(build_parser(), "holdwarden")
        if not action.help
    ]
    assert missing == []


def test_read_commands_take_kubectl_flags() -> None:
    parser = build_parser()
    for argv in (["status", "job"], ["preflight"], ["audit"]):
        for output in ("json", "yaml", "wide"):
            args = parser.parse_args([*argv, "-n", "team-a", "-o", output])
            assert (args.namespace, args.output) == ("team-a", output)
    for argv in (["status", "job"], ["hold", "job", "--instance", "1"], ["preflight"]):
        args = parser.parse_args([*argv, "--context", "prod", "--kubeconfig", "kc"])
        assert (args.context, args.kubeconfig) == ("prod", "kc")


# -- credentials: kubectl's precedence ---------------------------------------------------


def _kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "main", "context": context},
                    {"name": "other", "context": {**context, "namespace": "from-other"}},
                ],
                "current-context": "main",
            }
        )
    )
    return path


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME with ~/.kube/config, no $KUBECONFIG, and no in-cluster token."""
    (tmp_path / ".kube").mkdir()
    _kubeconfig(tmp_path / ".kube" / "config", "https://home.example:6443", "from-home")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def _host(kubeconfig: str | None = None, context: str | None = None) -> str:
    api = kubeclient.api_client(kubeconfig, context)
    try:
        return str(api.configuration.host)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_precedence_flag_then_env_then_home_then_in_cluster(
    homes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = _kubeconfig(homes / "flag", "https://flag.example:6443")
    env = _kubeconfig(homes / "env", "https://env.example:6443", "from-env")
    assert _host() == "https://home.example:6443"
    assert kubeclient.default_namespace() == "from-home"
    monkeypatch.setenv("KUBECONFIG", f"{homes / 'absent'}:{env}")  # a list, as kubectl takes
    assert _host() == "https://env.example:6443"
    assert kubeclient.default_namespace() == "from-env"
    assert kubeclient.default_namespace(context="other") == "from-other"
    assert _host(str(flag)) == "https://flag.example:6443"
    assert kubeclient.default_namespace(str(flag)) == "default"
    # No kubeconfig anywhere: in-cluster, which this is not; the error says what was tried.
    monkeypatch.delenv("KUBECONFIG")
    (homes / ".kube" / "config").unlink()
    with pytest.raises(kubeclient.KubeconfigError, match="not a Pod with a service-account"):
        kubeclient.api_client()
    with pytest.raises(kubeclient.KubeconfigError, match="--context prod: no kubeconfig"):
        kubeclient.api_client(context="prod")


def test_a_bad_kubeconfig_is_named(
    homes: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = homes / "nowhere" / "kubeconfig"
    assert main(["status", "ns/job", "--kubeconfig", str(missing)]) == 2
    assert f"--kubeconfig {missing}: no such file" in capsys.readouterr().err
    broken = homes / "broken"
    broken.write_text("clusters: [oops\n")
    assert main(["status", "ns/job", "--kubeconfig", str(broken)]) == 2
    assert str(broken) in capsys.readouterr().err
    assert main(["status", "ns/job", "--context", "nope"]) == 2
    err = capsys.readouterr().err
    assert str(homes / ".kube" / "config") in err and "nope" in err
    monkeypatch.setenv("KUBECONFIG", str(missing))
    assert main(["preflight"]) == 2
    assert f"$KUBECONFIG={missing}: no such file" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_says_so_at_once(
    homes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = _kubeconfig(homes / "kc", f"https://127.0.0.1:{_closed_port()}")
    for argv in (["status", "ns/job"], ["hold", "ns/job", "--instance", "1"]):
        started = time.monotonic()
        code = main([*argv, "--kubeconfig", str(kubeconfig)])
        elapsed = time.monotonic() - started
        err = capsys.readouterr().err
        assert code == Unreachable.exit_code == 9, err
        assert "unreachable" in err and "refused" in err, err
        assert elapsed < 5, f"{argv}: {elapsed:.1f}s to report a refused connection"


# -- output formats ----------------------------------------------------------------------


def test_audit_output_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    records = [
        {"time": "2026-01-01T00:00:00Z", "rule": "held-workload-inactive", "namespace": "a",
         "name": "j", "instance": 3, "user": "alice", "operation": "UPDATE", "dryRun": False,
         "uid": "u-1"},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["audit", "--log", str(log), "-o", "json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == records
    assert main(["audit", "--log", str(log), "-o", "yaml"]) == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == records
    assert main(["audit", "--log", str(log), "-o", "wide", "-n", "a"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["TIME", "RULE", "NAMESPACE", "NAME", "INSTANCE", "USER",
                              "OPERATION", "DRYRUN", "UID"]  # fmt: skip
    assert row.split()[-1] == "u-1"


def test_audit_of_a_missing_log_is_an_error_not_an_empty_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "audit.jsonl"
    assert main(["audit", "--log", str(missing)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"no audit log at {missing}" in captured.err and "--log" in captured.err
    # Only a rotated file left (the current one deleted): it is read, not an error.
    (tmp_path / "nowhere").mkdir()
    record = {"time": "2026-01-01T00:00:00Z", "rule": "hold-instance-monotonic", "uid": "u-9"}
    Path(f"{missing}.1").write_text(json.dumps(record) + "\n")
    assert main(["audit", "--log", str(missing), "-o", "json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [record]


def test_audit_reads_standard_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        {"time": "2026-01-01T00:00:00Z", "rule": "held-workload-kept", "namespace": "a",
         "name": "j", "uid": "u-1"},
        {"time": "2026-01-01T00:00:01Z", "rule": "kueue-owns-suspend", "namespace": "b",
         "name": "k", "uid": "u-2"},
    ]  # fmt: skip
    # Two Pods' files concatenated, with a log line that is not a record between them.
    text = json.dumps(records[0]) + "\nnot json\n" + json.dumps(records[1]) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["audit", "--log", "-", "-n", "b", "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line) for line in captured.out.splitlines()] == [records[1]]
    assert "skipped 1 unreadable line" in captured.err and "<stdin>:2" in captured.err


# -- completion and the kubectl plugin ---------------------------------------------------


def test_completion_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in ("bash", "zsh", "tcsh"):
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        words: tuple[str, ...] = ("holdwarden", "preflight", "completion")
        if shell != "tcsh":  # shtab's tcsh script completes sub-commands only
            words += ("--kubeconfig", "--instance", "--output")
        for word in words:
            assert word in script, (shell, word)
    result = subprocess.run(
        ["bash", "-n"], input=_bash_script(), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr


def _bash_script() -> str:
    import shtab

    return str(shtab.complete(build_parser(), shell="bash"))


def test_kubectl_plugin_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-holdwarden"] == "holdwarden.cli:kubectl_main"
    with pytest.raises(SystemExit) as raised:
        kubectl_main(["--help"])
    assert raised.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kubectl holdwarden")
    installed = Path(sys.executable).parent / "kubectl-holdwarden"
    if installed.exists():  # the editable install made it (make test's set-up does)
        result = subprocess.run(
            [str(installed), "--version"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0 and result.stdout.startswith("holdwarden "), result


# -- against the real control plane ------------------------------------------------------


@pytest.fixture
def plain_config(tmp_path: Path) -> Path:
    path = tmp_path / "holdwarden.yaml"
    path.write_text("mode: plain\nholder: operator\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.controlplane
def test_not_found_refused_and_namespaces_on_the_real_apiserver(
    cluster: LocalCluster,
    namespace: str,
    plain_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kubernetes import client as k8s

    with cluster.api_client() as admin:
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs",
            trainjob_body("job", suspend=True),
        )  # fmt: skip
    common = ["--config", str(plain_config), "--kubeconfig", str(cluster.kubeconfig_path)]

    # A 404 is "not found" (exit 5), never "rejected".
    code, _, err = _run(capsys, "status", "absent", "-n", namespace, *common)
    assert code == NotFound.exit_code == 5
    assert "holdwarden status: not found: " in err and "rejected" not in err

    # -n with a bare NAME; -o json|yaml|wide.
    code, out, _ = _run(capsys, "status", "job", "-n", namespace, "-o", "json", *common)
    assert code == 0 and json.loads(out)["ref"] == f"{namespace}/job"
    code, out, _ = _run(capsys, "status", f"{namespace}/job", "-o", "yaml", *common)
    assert code == 0 and yaml.safe_load(out)["state"] == "at-start-gate"
    code, out, _ = _run(capsys, "status", f"{namespace}/job", "-o", "wide", *common)
    header, row = out.splitlines()
    assert header.split()[:2] == ["REF", "STATE"] and row.split()[:2] == [
        f"{namespace}/job", "at-start-gate"]  # fmt: skip
    code, _, err = _run(capsys, "status", f"{namespace}/job", "-n", "elsewhere", *common)
    assert code == 2 and "-n says elsewhere" in err
    for output, parse in (("json", json.loads), ("yaml", yaml.safe_load)):
        code, out, _ = _run(capsys, "preflight", "-n", namespace, "-o", output, *common)
        assert code == 0 and parse(out)["namespace"] == namespace
    code, out, _ = _run(capsys, "preflight", "-n", namespace, "-o", "wide", *common)
    assert out.splitlines()[0].split() == ["MODE", "NAMESPACE", "CAPABILITY", "SUPPORTED", "REASON"]

    # The kubeconfig context's namespace is what a bare NAME means, as in kubectl.
    config = yaml.safe_load(cluster.kubeconfig_path.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    scoped = tmp_path / "scoped-kubeconfig"
    scoped.write_text(yaml.safe_dump(config))
    code, out, _ = _run(capsys, "status", "job", "-o", "json", "--config", str(plain_config),
                        "--kubeconfig", str(scoped))  # fmt: skip
    assert code == 0 and json.loads(out)["ref"] == f"{namespace}/job"

    # Refused: an identity with no rights (a client certificate of the cluster's CA).
    assert cluster.ca is not None
    nobody = generate_client(cluster.ca, "holdwarden-test-nobody")
    (tmp_path / "nobody.crt").write_bytes(nobody.cert_pem)
    (tmp_path / "nobody.key").write_bytes(nobody.key_pem)
    config["users"][0]["user"] = {
        "client-certificate": str(tmp_path / "nobody.crt"),
        "client-key": str(tmp_path / "nobody.key"),
    }
    (tmp_path / "nobody-kubeconfig").write_text(yaml.safe_dump(config))
    code, _, err = _run(capsys, "status", "job", "--config", str(plain_config),
                        "--kubeconfig", str(tmp_path / "nobody-kubeconfig"))  # fmt: skip
    assert code == Rejected.exit_code == 3, err
    assert "holdwarden status: refused: " in err and "forbidden" in err.lower()
