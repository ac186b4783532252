"""Credentials without the Kubernetes client: in-cluster, and a kubeconfig's current context."""

import base64
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from gpuhealth_operator.client import kubeconfigs


def write(
    path: pathlib.Path, user: dict[str, object], cluster: dict[str, object] | None = None
) -> pathlib.Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}, {"name": "other", "user": {"token": "wrong"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(config))
    return path


EMBEDDED_CLUSTER = {
    "server": "https://127.0.0.1:6443",
    "certificate-authority-data": base64.b64encode(b"CA").decode(),
}
EMBEDDED_USER = {
    "client-certificate-data": base64.b64encode(b"CERT").decode(),
    "client-key-data": base64.b64encode(b"KEY").decode(),
}
"""A kubeconfig's cluster and user with everything embedded as data (as kind's and kubeadm's are)."""


def test_a_client_certificate_given_as_data_is_written_to_files(tmp_path: pathlib.Path) -> None:
    found = kubeconfigs.from_file(write(tmp_path / "config", EMBEDDED_USER, EMBEDDED_CLUSTER))
    assert found.server == "https://127.0.0.1:6443" and not found.insecure and found.token is None
    assert found.ca_path and pathlib.Path(found.ca_path).read_bytes() == b"CA"
    assert found.certificate_path and pathlib.Path(found.certificate_path).read_bytes() == b"CERT"
    assert found.private_key_path and pathlib.Path(found.private_key_path).read_bytes() == b"KEY"
    assert (
        pathlib.Path(found.private_key_path).stat().st_mode & 0o077 == 0
    )  # a key readable by its owner only


def test_a_token_and_files_named_relative_to_the_kubeconfig(tmp_path: pathlib.Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    cluster = {
        "server": "https://k:6443",
        "certificate-authority": "ca.crt",
        "insecure-skip-tls-verify": True,
    }
    found = kubeconfigs.from_file(write(tmp_path / "config", {"tokenFile": "token"}, cluster))
    assert found.token == "s3cret" and found.insecure and found.ca_path == str(tmp_path / "ca.crt")
    assert kubeconfigs.from_file(write(tmp_path / "c2", {"token": "abc"})).token == "abc"


def test_an_exec_plugin_goes_to_the_clients_loader_and_a_broken_file_is_named(tmp_path: pathlib.Path) -> None:
    with pytest.raises(kubeconfigs.NeedsClientLoader):
        kubeconfigs.from_file(write(tmp_path / "config", {"exec": {"command": "aws"}}))
    (tmp_path / "bad").write_text("current-context: nowhere\ncontexts: []\n")
    with pytest.raises(kubeconfigs.ConfigError, match="no context named 'nowhere'"):
        kubeconfigs.from_file(tmp_path / "bad")
    with pytest.raises(kubeconfigs.ConfigError, match="missing"):
        kubeconfigs.from_file(tmp_path / "missing")


def test_in_cluster_reads_the_service_account_and_is_none_outside_a_pod(tmp_path: pathlib.Path) -> None:
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "ca.crt").write_text("CA")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = kubeconfigs.in_cluster(tmp_path, env)
    assert found is not None
    assert found.server == "https://[fd00::1]:443" and found.token == "tok"
    assert found.token_path == str(tmp_path / "token") and found.ca_path == str(tmp_path / "ca.crt")
    assert kubeconfigs.in_cluster(tmp_path, {}) is None


def test_the_operator_does_not_load_the_kubernetes_client() -> None:
    """~40 MiB of generated models: kopf would import them, and nothing of the operator needs them."""
    code = (
        "import sys, gpuhealth_operator.runtime.cli, gpuhealth_operator.runtime.handlers;"
        " print('kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_keys_given_as_data_leave_no_copy_behind_when_the_process_ends(tmp_path: pathlib.Path) -> None:
    """An operator run with a kubeconfig that embeds its client key (kind's, kubeadm's admin.conf) writes
    the key out for TLS; every start used to leave that copy in the temp directory for good."""
    config = write(tmp_path / "config", EMBEDDED_USER, EMBEDDED_CLUSTER)
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = (
        "import pathlib, sys\n"
        "from gpuhealth_operator.client import kubeconfigs\n"
        "for _ in range(3):  # a new term reads the kubeconfig again: still one copy of each\n"
        "    found = kubeconfigs.from_file(pathlib.Path(sys.argv[1]))\n"
        "    assert pathlib.Path(found.private_key_path).read_bytes() == b'KEY'\n"
        "print(len(list(pathlib.Path(sys.argv[2]).rglob('*.pem'))))\n"
    )
    env = {**os.environ, "TMPDIR": str(temp)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(config), str(temp)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert out.stdout.strip() == "3", "the CA, the certificate and the key, once each while it runs"
    assert list(temp.iterdir()) == [], "nothing left once it ended"
