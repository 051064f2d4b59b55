"""The serving certificate is loaded again when its files change, as a kubelet swaps them
on renewal; files that do not load leave the previous certificate in use."""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from berth import metrics, server, tls
from devtools.secretmount import DATA, secret_files, write_atomically


def served_serial(context: ssl.SSLContext) -> int:
    """The serial of the certificate `context` presents, from a handshake in memory."""
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client_side = client.wrap_bio(c_in, c_out, server_side=False)
    server_side = context.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (client_side, server_side):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    der = client_side.getpeercert(binary_form=True)
    assert der is not None, "no handshake"
    return x509.load_der_x509_certificate(der).serial_number


def serial_of(pair: tls.KeyPair) -> int:
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


@pytest.fixture
def ca() -> tls.KeyPair:
    return tls.make_ca("reload-ca")


def mount(directory: Path, pair: tls.KeyPair) -> server.Tls:
    """Write `pair` as a kubelet mounts a Secret, and name the files as a pod sees them."""
    write_atomically(directory, {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem})
    return server.Tls(directory / "tls.crt", directory / "tls.key")


def test_unchanged_files_are_not_loaded_again(tmp_path: Path, ca: tls.KeyPair) -> None:
    certificate = server.ServingCertificate(mount(tmp_path, tls.issue(ca, common_name="a")))
    context = certificate.context
    assert certificate.reload() is False
    assert certificate.context is context


def test_a_renewal_is_served_to_new_connections(tmp_path: Path, ca: tls.KeyPair) -> None:
    first, second = tls.issue(ca, common_name="a"), tls.issue(ca, common_name="a")
    certificate = server.ServingCertificate(mount(tmp_path, first))
    assert served_serial(certificate.context) == serial_of(first)
    old = certificate.context

    mount(tmp_path, second)

    assert certificate.reload() is True
    assert served_serial(certificate.context) == serial_of(second)
    assert served_serial(old) == serial_of(first)  # what an open connection keeps


def test_a_load_sets_the_metrics_and_logs_serial_and_expiry(
    tmp_path: Path, ca: tls.KeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    pair = tls.issue(ca, common_name="a")
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    with caplog.at_level(logging.INFO, logger="berth.server"):
        server.ServingCertificate(mount(tmp_path, pair))
    assert metrics.SERVING_CERTIFICATE_NOT_AFTER._value.get() == (
        cert.not_valid_after_utc.timestamp()
    )
    assert metrics.SERVING_CERTIFICATE_LOADED._value.get() > 0
    assert f"serial {cert.serial_number:x}" in caplog.text
    assert cert.not_valid_after_utc.isoformat() in caplog.text


@pytest.mark.parametrize("broken", ["another key", "not PEM"])
def test_files_that_do_not_load_keep_the_previous_certificate(
    tmp_path: Path, ca: tls.KeyPair, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    first, second, third = (tls.issue(ca, common_name="a") for _ in range(3))
    certificate = server.ServingCertificate(mount(tmp_path, first))
    files = {
        "another key": {"tls.crt": second.cert_pem, "tls.key": third.key_pem},
        "not PEM": {"tls.crt": b"garbage", "tls.key": second.key_pem},
    }[broken]
    write_atomically(tmp_path, files)

    with caplog.at_level(logging.WARNING, logger="berth.server"):
        assert certificate.reload() is False
        assert certificate.reload() is False
    assert served_serial(certificate.context) == serial_of(first)
    assert caplog.text.count("do not load") == 1  # said once per change

    mount(tmp_path, third)
    assert certificate.reload() is True
    assert served_serial(certificate.context) == serial_of(third)


def test_files_missing_for_a_moment_keep_the_previous_certificate(
    tmp_path: Path, ca: tls.KeyPair
) -> None:
    first = tls.issue(ca, common_name="a")
    certificate = server.ServingCertificate(mount(tmp_path, first))
    (tmp_path / DATA).unlink()
    assert certificate.reload() is False
    assert served_serial(certificate.context) == serial_of(first)


def test_a_file_replaced_in_place_is_noticed(tmp_path: Path, ca: tls.KeyPair) -> None:
    """Plain files, not a kubelet mount: `berth certs` written again over the old ones."""
    first, second = tls.issue(ca, common_name="a"), tls.issue(ca, common_name="a")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first.write(cert_path=cert, key_path=key)
    certificate = server.ServingCertificate(server.Tls(cert, key))
    second.write(cert_path=cert, key_path=key)
    os.utime(cert, ns=(0, 1))  # same second, same size: the inode alone would not tell
    assert certificate.reload() is True
    assert served_serial(certificate.context) == serial_of(second)


def test_the_atomic_writer_swaps_one_directory(tmp_path: Path) -> None:
    write_atomically(tmp_path, {"tls.crt": b"1", "tls.key": b"1", "old": b"x"})
    first = os.readlink(tmp_path / DATA)
    write_atomically(tmp_path, {"tls.crt": b"2", "tls.key": b"2"})

    assert (tmp_path / "tls.crt").read_bytes() == b"2"
    assert os.readlink(tmp_path / "tls.crt") == f"{DATA}/tls.crt"
    assert not (tmp_path / first).exists()
    assert not (tmp_path / "old").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [DATA, os.readlink(tmp_path / DATA), "tls.crt", "tls.key"]
    )


def test_a_secret_becomes_its_decoded_keys() -> None:
    secret = {"data": {"tls.crt": "Y2VydA==", "ca.crt": "Y2E="}}
    assert secret_files(secret) == {"tls.crt": b"cert", "ca.crt": b"ca"}
    assert secret_files({}) == {}
