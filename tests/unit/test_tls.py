"""Certificates made by berth.tls chain to their CA and carry the names asked for."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from berth import tls


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_ca_is_a_ca() -> None:
    ca = load(tls.make_ca("test-ca").cert_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.subject == ca.issuer


@pytest.mark.parametrize(
    ("client", "usage"),
    [
        (False, ExtendedKeyUsageOID.SERVER_AUTH),
        (True, ExtendedKeyUsageOID.CLIENT_AUTH),
    ],
)
def test_leaf_is_signed_by_ca_with_its_usage(client: bool, usage: x509.ObjectIdentifier) -> None:
    ca = tls.make_ca()
    leaf = load(
        tls.issue(
            ca,
            common_name="leaf",
            client=client,
            organization="system:masters",
            dns_names=("a.example",),
            ip_addresses=("127.0.0.1",),
        ).cert_pem
    )
    leaf.verify_directly_issued_by(load(ca.cert_pem))
    assert leaf.extensions.get_extension_for_class(
        x509.ExtendedKeyUsage
    ).value == x509.ExtendedKeyUsage([usage])
    assert (
        leaf.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    )


def test_serving_set_has_ip_and_dns_sans(tmp_path: Path) -> None:
    paths = tls.write_serving_set(
        tmp_path, dns_names=("berth-webhook.berth-system.svc",), ip_addresses=("127.0.0.1",)
    )
    assert [p.name for p in paths] == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    cert = load((tmp_path / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["berth-webhook.berth-system.svc"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0


def test_a_renewal_is_signed_by_the_ca_already_there(tmp_path: Path) -> None:
    """`berth certs` run again renews the serving certificate under the same CA: every
    caBundle and caData that trusts it stays right. `new_ca` makes a new one."""
    names = ("berth-webhook.berth-system.svc",)
    tls.write_serving_set(tmp_path, dns_names=names, ip_addresses=())
    ca = (tmp_path / "ca.crt").read_bytes()
    first = (tmp_path / "tls.crt").read_bytes()
    tls.write_serving_set(tmp_path, dns_names=names, ip_addresses=())
    assert (tmp_path / "ca.crt").read_bytes() == ca
    renewed = load((tmp_path / "tls.crt").read_bytes())
    assert renewed.serial_number != load(first).serial_number
    renewed.verify_directly_issued_by(load(ca))
    tls.write_serving_set(tmp_path, dns_names=names, ip_addresses=(), new_ca=True)
    assert (tmp_path / "ca.crt").read_bytes() != ca


def test_a_ca_outlives_the_certificates_it_signs() -> None:
    ca = tls.make_ca()
    leaf = load(tls.issue(ca, common_name="leaf").cert_pem)
    assert load(ca.cert_pem).not_valid_after_utc - leaf.not_valid_after_utc > tls.VALIDITY * 5


def test_half_a_ca_is_refused(tmp_path: Path) -> None:
    tls.write_serving_set(tmp_path, dns_names=("a",), ip_addresses=())
    (tmp_path / "ca.key").unlink()
    with pytest.raises(ValueError, match=r"one of ca\.crt and ca\.key without the other"):
        tls.write_serving_set(tmp_path, dns_names=("a",), ip_addresses=())


def test_a_ca_that_would_expire_before_its_renewal_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CA valid a year (an earlier version's) would expire before the certificate it
    signs: refused, naming --new-ca; so are a leaf certificate in ca.crt and a key that is
    not the CA's."""
    with monkeypatch.context() as patched:
        patched.setattr(tls, "CA_VALIDITY", tls.VALIDITY)
        old = tls.make_ca()
    (tmp_path / "ca.crt").write_bytes(old.cert_pem)
    (tmp_path / "ca.key").write_bytes(old.key_pem)
    with pytest.raises(ValueError, match=r"before a certificate issued now would; give --new-ca"):
        tls.write_serving_set(tmp_path, dns_names=("a",), ip_addresses=())
    leaf = tls.issue(tls.make_ca(), common_name="not a CA")
    (tmp_path / "ca.crt").write_bytes(leaf.cert_pem)
    (tmp_path / "ca.key").write_bytes(leaf.key_pem)
    with pytest.raises(ValueError, match=r"ca\.crt is not a CA certificate; give --new-ca"):
        tls.write_serving_set(tmp_path, dns_names=("a",), ip_addresses=())
    (tmp_path / "ca.crt").write_bytes(tls.make_ca().cert_pem)
    (tmp_path / "ca.key").write_bytes(tls.make_ca().key_pem)
    with pytest.raises(ValueError, match=r"ca\.key is not the key of ca\.crt"):
        tls.write_serving_set(tmp_path, dns_names=("a",), ip_addresses=())
    tls.write_serving_set(tmp_path, dns_names=("a",), ip_addresses=(), new_ca=True)
    issued = load((tmp_path / "tls.crt").read_bytes())
    assert issued.issuer == load((tmp_path / "ca.crt").read_bytes()).subject
