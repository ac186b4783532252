"""The control plane's certificates: trusted by one CA, naming the right hosts and identities."""

import shutil
import subprocess

import pytest

from gpuhealth_sim.controlplane import pki

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.create(tmp_path_factory.mktemp("pki"), service_ip="10.96.0.1")


def openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def test_serving_certificate_is_signed_by_the_ca_for_loopback_and_service_names(keys: pki.Pki) -> None:
    assert openssl("verify", "-CAfile", str(keys.ca.cert), str(keys.serving.cert)).strip().endswith(": OK")
    text = openssl("x509", "-in", str(keys.serving.cert), "-noout", "-ext", "subjectAltName")
    for name in ("IP Address:127.0.0.1", "IP Address:10.96.0.1", "DNS:kubernetes.default.svc"):
        assert name in text


def test_client_certificate_carries_user_and_groups(keys: pki.Pki) -> None:
    admin = pki.client_cert(keys, "admin", user="gpu-health-admin", groups=("system:masters",))

    subject = openssl("x509", "-in", str(admin.cert), "-noout", "-subject", "-nameopt", "RFC2253")
    assert subject.strip() == "subject=CN=gpu-health-admin,O=system:masters"
    assert openssl("verify", "-CAfile", str(keys.ca.cert), str(admin.cert)).strip().endswith(": OK")


def test_service_account_key_pair_matches(keys: pki.Pki) -> None:
    derived = openssl("pkey", "-in", str(keys.service_account_key), "-pubout")

    assert derived == keys.service_account_public_key.read_text()
    assert "modulus" in openssl("pkey", "-in", str(keys.service_account_key), "-noout", "-text")  # RSA
