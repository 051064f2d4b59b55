"""Certificates for the webhook, the extender and the local control plane.

cert-manager issues the webhook's certificate in production; where it is absent
(and for the local control plane) Berth makes its own small CA with `cryptography`.
Everything here is plain data in, PEM bytes out, so callers decide where files go.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
"""How long a serving or client certificate is valid."""
CA_VALIDITY = datetime.timedelta(days=3650)
"""How long a CA is valid: a renewal of the certificates it signs changes nothing that
trusts it (the webhook configurations' caBundle, kube-scheduler's caData)."""

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, *, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert_pem)
        key_path.touch(mode=0o600)
        key_path.chmod(0o600)  # a key file already there keeps no wider mode
        key_path.write_bytes(self.key_pem)


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    validity: datetime.timedelta = VALIDITY,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
    )


def make_ca(common_name: str = "berth-ca") -> KeyPair:
    """A self-signed CA that can sign serving and client certificates."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key(), CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    *,
    common_name: str,
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    organization: str | None = None,
    client: bool = False,
) -> KeyPair:
    """A leaf certificate signed by `ca`: a serving one, or a client one with `client=True`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError("the CA key must be an EC or RSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = _builder(_name(common_name, organization), ca_cert.subject, key.public_key())
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    # Key identifiers, which a strict verifier (Python 3.13's default context) requires.
    builder = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
    )
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
    )
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_signing_key() -> tuple[bytes, bytes]:
    """An RSA key pair (private PEM, public PEM) for signing service-account tokens."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


def _unusable_ca(ca: KeyPair) -> str | None:
    """Why `ca` cannot sign a new serving certificate for its whole validity, if so: files
    that do not load (an encrypted key), no CA, a key that is not the certificate's, or a
    CA that expires before a certificate issued now would (one of an earlier version,
    valid a year)."""
    try:
        cert = x509.load_pem_x509_certificate(ca.cert_pem)
        key = serialization.load_pem_private_key(ca.key_pem, password=None)
    except (ValueError, TypeError) as error:
        return f"ca.crt and ca.key do not load ({error})"
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        return "ca.crt is not a CA certificate"
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.PEM
    if key.public_key().public_bytes(encoding, public) != cert.public_key().public_bytes(
        encoding, public
    ):
        return "ca.key is not the key of ca.crt"
    until = datetime.datetime.now(datetime.UTC) + VALIDITY
    if cert.not_valid_after_utc < until:
        return (
            f"the CA expires {cert.not_valid_after_utc:%Y-%m-%d}, before a certificate "
            "issued now would"
        )
    return None


def write_serving_set(
    out_dir: Path,
    *,
    dns_names: tuple[str, ...],
    ip_addresses: tuple[str, ...],
    new_ca: bool = False,
) -> list[Path]:
    """Write ca.crt, ca.key, tls.crt and tls.key: what `berth certs` makes. A CA already
    in `out_dir` signs the new serving certificate (a renewal: whatever trusts the CA
    trusts it), unless `new_ca`; ValueError when only one of its two files is there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out_dir / "ca.crt", out_dir / "ca.key"
    if not new_ca and ca_cert.exists() != ca_key.exists():
        raise ValueError(f"{out_dir}: one of ca.crt and ca.key without the other")
    if not new_ca and ca_cert.exists():
        ca = KeyPair(ca_cert.read_bytes(), ca_key.read_bytes())
        problem = _unusable_ca(ca)
        if problem:
            raise ValueError(f"{out_dir}: {problem}; give --new-ca to make a new CA")
    else:
        ca = make_ca()
    common_name = dns_names[0] if dns_names else (ip_addresses[0] if ip_addresses else "berth")
    serving = issue(ca, common_name=common_name, dns_names=dns_names, ip_addresses=ip_addresses)
    paths = [out_dir / name for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")]
    ca.write(cert_path=paths[0], key_path=paths[1])
    serving.write(cert_path=paths[2], key_path=paths[3])
    return paths
