"""Throwaway certificates for tests and ``replikafka cluster start --secure``, made
with ``cryptography`` (a real CA, real X.509 leaf certificates, PEM files).

For real hosts use your organisation's CA; the README's "Securing a cluster"
section shows the ``openssl`` commands. Files written here are the same PEM
files a broker reads through ``ssl.ca.location``, ``ssl.certificate.location``
and ``ssl.key.location``.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS_DEFAULT = 30


@dataclass(frozen=True)
class CertFiles:
    """PEM paths of one identity (the CA's ``key`` signs leaves)."""
    ca: str
    certificate: str
    key: str
    key_password: str | None = None


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "replikafka"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: str, data: bytes, private: bool = False) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _key_pem(key, password: str | None) -> bytes:
    enc = (serialization.BestAvailableEncryption(password.encode()) if password
           else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


class CertificateAuthority:
    """A self-signed CA that issues leaf certificates into a directory."""

    def __init__(self, directory: str, name: str = "replikafka-test-ca", valid_days: int = VALID_DAYS_DEFAULT):
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        self.name = _name(name)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=valid_days))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_path = _write(os.path.join(directory, "ca.pem"), self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
              key_password: str | None = None, valid_days: int = VALID_DAYS_DEFAULT,
              expired: bool = False, file_stem: str | None = None) -> CertFiles:
        """A leaf certificate for ``common_name`` (usable as TLS server and client) with
        ``hosts`` as subject alternative names. ``expired`` makes one that ended yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        start, end = ((now - dt.timedelta(days=10), now - dt.timedelta(days=1)) if expired
                      else (now - dt.timedelta(minutes=5), now + dt.timedelta(days=valid_days)))
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(self.name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        stem = os.path.join(self.directory, file_stem or common_name)
        return CertFiles(self.ca_path,
                         _write(stem + ".pem", cert.public_bytes(serialization.Encoding.PEM)),
                         _write(stem + ".key", _key_pem(key, key_password), private=True),
                         key_password)


def certificate_expiry(path: str) -> dt.datetime:
    """When the (first) certificate of a PEM file stops being valid (UTC)."""
    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    return cert.not_valid_after_utc


def decrypted_key_pem(path: str, password: str | None) -> bytes:
    """The PEM private key of ``path``, decrypted with ``ssl.key.password`` if it is encrypted
    (gRPC takes only unencrypted keys)."""
    with open(path, "rb") as f:
        data = f.read()
    key = serialization.load_pem_private_key(data, password.encode() if password else None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
