"""TLS for sandbox hosts: a local certificate authority, made on first use, that signs a
certificate for each ``<port>-<id>.localhost`` name as a client asks for it (SNI).

E2B code reaches a sandbox port as ``https://<port>-<id>.<domain>``. A wildcard cannot
serve that here (``*.localhost`` is a wildcard over a top-level name, which TLS clients
refuse), so each host name gets its own leaf certificate, made in about a millisecond and
kept in memory. Clients trust the CA through a bundle — the system's CAs plus this one —
that ``forkpoint e2b env`` exports (``SSL_CERT_FILE`` and friends); nothing touches the
system's trust store.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["SYSTEM_BUNDLES", "LocalCA"]

#: Where Debian (ca-certificates) and others keep the system's CAs, first found is used.
SYSTEM_BUNDLES = (
    Path("/etc/ssl/certs/ca-certificates.crt"),
    Path("/etc/pki/tls/certs/ca-bundle.crt"),
)
_CA_DAYS = 3650
_LEAF_DAYS = 90
_MAX_LEAVES = 4096  # leaf contexts kept; beyond that, made again


class LocalCA:
    """The CA's files under ``directory``: ``ca.pem``, ``ca.key`` (0600), and
    ``bundle.pem`` (the system's CAs + ``ca.pem``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert_path = directory / "ca.pem"
        self.key_path = directory / "ca.key"
        self.bundle_path = directory / "bundle.pem"
        self._lock = threading.Lock()
        self._leaves: dict[str, ssl.SSLContext] = {}
        self._ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())

    def ensure(self) -> LocalCA:
        """Make the CA and the bundle if they are missing (idempotent, atomic files)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not (self.cert_path.exists() and self.key_path.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _ca_certificate(key)
            _write(self.key_path, _key_pem(key), 0o600)
            _write(self.cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        if not self.bundle_path.exists():
            system = next((p.read_bytes() for p in SYSTEM_BUNDLES if p.is_file()), b"")
            if system and not system.endswith(b"\n"):
                system += b"\n"
            _write(self.bundle_path, system + self.cert_path.read_bytes(), 0o644)
        return self

    def server_context(self) -> ssl.SSLContext:
        """A server context that picks each connection's certificate by its SNI name."""
        self.ensure()
        default = self._leaf("localhost")

        def pick(sock: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
            sock.context = self._leaf(name or "localhost")

        default.sni_callback = pick
        return default

    def _leaf(self, name: str) -> ssl.SSLContext:
        name = name.lower().rstrip(".")
        with self._lock:
            context = self._leaves.get(name)
            if context is not None:
                return context
            ca_cert, ca_key = self._load()
            cert = _leaf_certificate(name, self._leaf_key, ca_cert, ca_key)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            # ssl loads a chain from a file only: a scratch one in the CA's 0700 directory
            with tempfile.TemporaryDirectory(dir=self.directory) as scratch:
                chain = Path(scratch) / "chain.pem"
                chain.write_bytes(
                    cert.public_bytes(serialization.Encoding.PEM) + _key_pem(self._leaf_key)
                )
                context.load_cert_chain(chain)
            if len(self._leaves) >= _MAX_LEAVES:
                self._leaves.clear()
            self._leaves[name] = context
            return context

    def _load(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        if self._ca is None:
            cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{self.key_path} is not an EC key")
            self._ca = (cert, key)
        return self._ca


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "forkpoint local CA")])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        alt = x509.DNSName(name)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically with ``mode`` from the start (a key is never world-readable)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
