"""Every server serves HTTPS, or plain HTTP only when asked for by name (`--insecure`)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from berth import server


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


def test_a_certificate_serves_https(pem: Path) -> None:
    args = flags(f"--tls-cert-file={pem}", f"--tls-private-key-file={pem}")
    assert server.serving_problem(args) is None
    assert server.tls_from(args) == server.Tls(pem, pem, None)


@pytest.mark.parametrize("component", ["controller", "extender"])
def test_the_command_says_so_in_one_line_and_exits(component: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.berth", component],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
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
