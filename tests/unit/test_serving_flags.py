"""Every server serves HTTPS, or plain HTTP only when asked for by name (`--insecure`)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from berth import server, tls


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server.add_tls_arguments(parser, plain="test")
    server.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "tls.pem"
    path.write_text("not checked here")
    return path


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A serving certificate and its key, as files."""
    issued = tls.issue(tls.make_ca(), common_name="server", dns_names=("localhost",))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    return cert, key


def test_no_certificate_and_no_insecure_is_refused() -> None:
    assert server.serving_problem(flags()) == (
        "give --tls-cert-file and --tls-private-key-file, or --insecure to serve plain HTTP"
    )


def test_insecure_alone_serves_plain_http() -> None:
    args = flags("--insecure")
    assert server.serving_problem(args) is None
    assert server.tls_from(args) is None


def test_insecure_with_a_certificate_is_refused(pem: Path) -> None:
    args = flags("--insecure", f"--tls-cert-file={pem}", f"--tls-private-key-file={pem}")
    assert server.serving_problem(args) == (
        "--insecure serves plain HTTP: give it no certificate and no client CA"
    )


def test_a_missing_file_is_named(pem: Path, tmp_path: Path) -> None:
    args = flags(f"--tls-cert-file={pem}", f"--tls-private-key-file={tmp_path / 'nope.key'}")
    assert server.serving_problem(args) == f"{tmp_path / 'nope.key'}: no such file"


def test_a_certificate_serves_https(pair: tuple[Path, Path]) -> None:
    cert, key = pair
    args = flags(f"--tls-cert-file={cert}", f"--tls-private-key-file={key}")
    assert server.serving_problem(args) is None
    assert server.tls_from(args) == server.Tls(cert, key, None)


@pytest.mark.parametrize(
    ("garble", "named", "problem"),
    [
        pytest.param("cert", "tls.crt", "not a PEM certificate", id="a garbled certificate"),
        pytest.param("key", "tls.key", "not an unencrypted PEM private key", id="a garbled key"),
        pytest.param("other key", "tls.key", "is not the key of", id="another certificate's key"),
        pytest.param("ca", "ca.crt", "no PEM CA certificate in it", id="a client CA of nothing"),
    ],
)
def test_files_that_do_not_load_are_named_before_anything_starts(
    pair: tuple[Path, Path], tmp_path: Path, garble: str, named: str, problem: str
) -> None:
    cert, key = pair
    ca = tmp_path / "ca.crt"
    ca.write_bytes(tls.make_ca().cert_pem)
    if garble == "cert":
        cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    elif garble == "key":
        key.write_text("not a key")
    elif garble == "other key":
        key.write_bytes(tls.issue(tls.make_ca(), common_name="other").key_pem)
    else:
        ca.write_text("nothing")
    args = flags(
        f"--tls-cert-file={cert}", f"--tls-private-key-file={key}", f"--client-ca-file={ca}"
    )
    found = server.serving_problem(args)
    assert found is not None
    assert str(tmp_path / named) in found
    assert problem in found


def test_a_certificate_berth_makes_verifies_strictly() -> None:
    """With the key identifiers that a strict verifier (`VERIFY_X509_STRICT`, on by
    default in Python 3.13's clients) requires of a certificate and of its issuer."""
    ca = tls.make_ca()
    issued = tls.issue(ca, common_name="server", dns_names=("localhost",))
    leaf = x509.load_pem_x509_certificate(issued.cert_pem)
    issuer = x509.load_pem_x509_certificate(ca.cert_pem)
    authority = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    subject = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert authority.key_identifier == subject.digest
    leaf.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)


@pytest.mark.parametrize("component", ["controller", "extender"])
def test_the_command_says_so_in_one_line_and_exits(component: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.berth", component],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2  # a configuration the command cannot use
    assert result.stderr.strip() == (
        f"berth {component}: give --tls-cert-file and --tls-private-key-file, "
        "or --insecure to serve plain HTTP"
    )


def test_the_limits_come_from_their_flags() -> None:
    args = flags("--insecure", "--max-connections=9", "--max-pending-bytes=9000000")
    assert server.limits_from(args) == server.Limits(max_connections=9, max_pending_bytes=9_000_000)
    assert server.limits_from(flags("--insecure")) == server.Limits()


def test_a_budget_that_one_body_could_not_fit_in_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        flags("--insecure", "--max-pending-bytes=4096")
    assert "--max-pending-bytes: must be at least 8388608, not 4096" in capsys.readouterr().err
