"""A kubeconfig with embedded certificates loads with no writable temporary directory (the
image's read-only root): the certificates become sealed in-memory files, nothing is
written to disk or back to the kubeconfig, and the CLI talks to the real apiserver with
them. tests/controlplane/test_image.py runs the same in the built image."""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path

import pytest
import yaml

from holdwarden import kubeclient
from holdwarden.adapter.errors import NotFound
from holdwarden.certs.generate import generate_ca, generate_client
from holdwarden.cli import main
from rig.builders import trainjob_body
from rig.localcluster import LocalCluster
from rig.localcluster.cluster import kubeconfig_document, write_kubeconfig


@pytest.fixture
def no_temp_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every temporary file this process would make fails, as on a read-only root."""
    gone = tmp_path / "no-such-dir"
    monkeypatch.setattr(tempfile, "tempdir", str(gone))
    with pytest.raises(FileNotFoundError):
        tempfile.mkstemp()
    return gone


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_embedded_certificates_load_without_a_temporary_directory(
    tmp_path: Path, no_temp_dir: Path
) -> None:
    ca = generate_ca(common_name="embedded-test-ca")
    user = generate_client(ca, "embedded-test-user")
    document = kubeconfig_document(
        "https://127.0.0.1:6443",
        "someone",
        {"client-certificate-data": _b64(user.cert_pem), "client-key-data": _b64(user.key_pem)},
        ca_pem=ca.cert_pem,
    )
    path = write_kubeconfig(tmp_path / "kubeconfig", document)
    before = path.read_bytes()

    api = kubeclient.api_client(str(path))
    try:
        configuration = api.configuration
        files = {
            "ca": (configuration.ssl_ca_cert, ca.cert_pem),
            "cert": (configuration.cert_file, user.cert_pem),
            "key": (configuration.key_file, user.key_pem),
        }
        for what, (name, content) in files.items():
            assert str(name).startswith("/proc/self/fd/"), (what, name)
            assert Path(name).read_bytes() == content, what
            # Sealed: not even this process can change what TLS will read.
            with pytest.raises(PermissionError), open(name, "r+b") as handle:
                handle.write(b"x")
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert path.read_bytes() == before, "the kubeconfig was written back"
    assert not no_temp_dir.exists()
    # The same content twice is one memory file, not a new descriptor per load.
    again = kubeclient.api_client(str(path))
    try:
        assert again.configuration.key_file == configuration.key_file
    finally:
        again.close()  # type: ignore[no-untyped-call]


def test_merged_kubeconfigs_keep_relative_files_and_pick_the_context(
    tmp_path: Path, no_temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$KUBECONFIG's merge as before: a relative certificate path is read beside its own
    file, and only the chosen context's embedded certificates are made memory files."""
    ca = generate_ca(common_name="merge-test-ca")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ca.crt").write_bytes(ca.cert_pem)
    files_doc = kubeconfig_document(
        "https://files.invalid:6443", "files-user", {"token": "abc"}, ca_path=Path("ca.crt"),
        cluster_name="files",
    )  # fmt: skip
    data_doc = kubeconfig_document(
        "https://data.invalid:6443", "data-user", {"token": "def"}, ca_pem=ca.cert_pem,
        cluster_name="data",
    )  # fmt: skip
    first = write_kubeconfig(tmp_path / "sub" / "files", files_doc)
    second = write_kubeconfig(tmp_path / "data", data_doc)
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    api = kubeclient.api_client(context="files")
    try:
        assert api.configuration.host == "https://files.invalid:6443"
        assert api.configuration.ssl_ca_cert == str(tmp_path / "sub" / "ca.crt")
    finally:
        api.close()  # type: ignore[no-untyped-call]
    api = kubeclient.api_client(context="data")
    try:
        assert api.configuration.host == "https://data.invalid:6443"
        assert str(api.configuration.ssl_ca_cert).startswith("/proc/self/fd/")
    finally:
        api.close()  # type: ignore[no-untyped-call]
    # A garbled embedded field is still the kubernetes client's error, naming the file.
    broken = yaml.safe_load(second.read_text())
    broken["clusters"][0]["cluster"]["certificate-authority-data"] = "%%% not base64"
    write_kubeconfig(second, broken)
    with pytest.raises(kubeclient.KubeconfigError, match="KUBECONFIG"):
        kubeclient.api_client(context="data")


def test_the_cli_uses_embedded_certificates_on_the_real_apiserver(
    cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    no_temp_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kubernetes import client as k8s

    with cluster.api_client() as admin:
        k8s.CustomObjectsApi(admin).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs",
            trainjob_body("job", suspend=True),
        )  # fmt: skip
    kubeconfig = cluster.embedded_kubeconfig(tmp_path / "embedded")
    config = tmp_path / "holdwarden.yaml"
    config.write_text("mode: plain\nholder: operator\n")
    common = ["-n", namespace, "--config", str(config), "--kubeconfig", str(kubeconfig)]
    assert main(["status", "job", "-o", "yaml", *common]) == 0, capsys.readouterr().err
    assert yaml.safe_load(capsys.readouterr().out)["state"] == "at-start-gate"
    assert main(["status", "absent", *common]) == NotFound.exit_code
    assert "not found" in capsys.readouterr().err
