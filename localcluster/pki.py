"""Certificates signed by the local cluster's CA.

kwokctl keeps the CA in ``<cluster dir>/pki/ca.crt`` and ``ca.key``; kube-apiserver trusts
client certificates it signed (the users of users.py) and, given it as a ``caBundle``,
serving certificates it signed (the JobSet controller's webhook on loopback).
"""

from __future__ import annotations

import datetime
import ipaddress
import warnings
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_DAYS = 365


def ca_cert(cluster_dir: Path) -> bytes:
    """The cluster CA's certificate (PEM), for a ``caBundle``."""
    return (cluster_dir / "pki" / "ca.crt").read_bytes()


def issue(cluster_dir: Path, common_name: str, organizations: Sequence[str] = (),
          hosts: Sequence[str] = ()) -> tuple[bytes, bytes]:
    """A certificate and its key (PEM) signed by the cluster's CA: for a client when no
    ``hosts`` are given (the common name is the user, the organisations its groups), else
    for a server answering at ``hosts`` (names or IP addresses)."""
    pki = cluster_dir / "pki"
    with warnings.catch_warnings():
        # kwokctl's CA has a serial number that is not positive, which RFC 5280 forbids
        # and cryptography warns about; only its subject is used here.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        ca = x509.load_pem_x509_certificate(ca_cert(cluster_dir))
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([
        *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
