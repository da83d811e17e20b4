"""The admission webhook's TLS certificates, made and rotated by the dispatcher itself.

kube-apiserver calls webhooks over TLS only, and checks the server's certificate against
the ``caBundle`` of the webhook configuration. Rather than needing cert-manager, the
dispatcher keeps a small CA and a serving certificate in a Secret of its own namespace:
every replica (and every restart) serves the same certificate, whichever of them renews
it writes the Secret (a conflicting write means another replica won: it reads theirs),
and the CA is patched into its Mutating/ValidatingWebhookConfigurations.

- The CA lives 10 years and is replaced when less than one year is left; the previous CA
  stays in the caBundle while it is valid, so the API server trusts the certificates of
  replicas that have not reloaded yet.
- The serving certificate lives 90 days and is replaced when less than 30 are left, or
  when it does not name every host it must (a changed Service name, a new --cert-host).

:func:`plan_renewal` and :func:`renew` are pure (they take the time), so the rotation
rules are tested without waiting for years; :class:`SecretCertificates` does the I/O.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.wording import counted

log = logging.getLogger("dispatcher.webhook")

CA_LIFETIME = datetime.timedelta(days=3650)
CA_RENEW_BEFORE = datetime.timedelta(days=365)
SERVING_LIFETIME = datetime.timedelta(days=90)
SERVING_RENEW_BEFORE = datetime.timedelta(days=30)
# Clocks of the API server and the dispatcher may differ a little.
BACKDATE = datetime.timedelta(minutes=5)

SECRETS = Resource("v1", "Secret", "secrets", True)
MUTATING = Resource("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration",
                    "mutatingwebhookconfigurations", False)
VALIDATING = Resource("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
                      "validatingwebhookconfigurations", False)

CRDS = Resource("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                "customresourcedefinitions", False)
# The CRD whose conversion webhook (v1beta1 <-> v1beta2) this webhook serves.
APPWRAPPER_CRD = "appwrappers.workload.codeflare.dev"

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
PREVIOUS_CA = "ca-previous.crt"


@dataclass(frozen=True)
class Certificates:
    """PEM bytes: the CA (with its key), the serving certificate and key, and the CA
    that signed before the current one (empty if none)."""

    ca_cert: bytes
    ca_key: bytes
    tls_cert: bytes
    tls_key: bytes
    previous_ca: bytes = b""

    def ca_bundle(self, now: datetime.datetime) -> bytes:
        """What the API server should trust: the CA, and the previous one while valid."""
        bundle = self.ca_cert
        if self.previous_ca and _not_after(self.previous_ca) > now:
            bundle += self.previous_ca
        return bundle

    def secret_data(self) -> dict[str, str]:
        data = {CA_CERT: self.ca_cert, CA_KEY: self.ca_key, TLS_CERT: self.tls_cert,
                TLS_KEY: self.tls_key}
        if self.previous_ca:
            data[PREVIOUS_CA] = self.previous_ca
        return {k: base64.b64encode(v).decode() for k, v in data.items()}

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str]) -> Certificates | None:
        """The certificates in a Secret's data; None if any part is missing or unreadable
        (they are then made anew)."""
        try:
            raw = {k: base64.b64decode(v) for k, v in data.items()}
            certs = cls(raw[CA_CERT], raw[CA_KEY], raw[TLS_CERT], raw[TLS_KEY],
                        raw.get(PREVIOUS_CA, b""))
            for pem in (certs.ca_cert, certs.tls_cert):
                x509.load_pem_x509_certificate(pem)
            for pem in (certs.ca_key, certs.tls_key):
                serialization.load_pem_private_key(pem, None)
        except (KeyError, ValueError, TypeError):
            return None
        return certs


def plan_renewal(certs: Certificates | None, hosts: Sequence[str], now: datetime.datetime
                 ) -> str | None:
    """Why the certificates must be renewed now, or None if they are good."""
    if certs is None:
        return "no certificate yet"
    ca_left = _not_after(certs.ca_cert) - now
    if ca_left < CA_RENEW_BEFORE:
        return f"the CA expires in {counted(max(ca_left.days, 0), 'day')}"
    serving = x509.load_pem_x509_certificate(certs.tls_cert)
    left = serving.not_valid_after_utc - now
    if left < SERVING_RENEW_BEFORE:
        return f"the serving certificate expires in {counted(max(left.days, 0), 'day')}"
    if serving.issuer != x509.load_pem_x509_certificate(certs.ca_cert).subject:
        return "the serving certificate was not signed by the CA"
    missing = [h for h in hosts if h not in _names(serving)]
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    return None


def renew(certs: Certificates | None, hosts: Sequence[str], now: datetime.datetime
          ) -> Certificates:
    """New serving certificate for ``hosts``; a new CA too if there is none or it is
    due for renewal (the old one is kept as the previous CA)."""
    if certs is None or _not_after(certs.ca_cert) - now < CA_RENEW_BEFORE:
        ca_cert, ca_key = _issue_ca(now)
        previous = certs.ca_cert if certs is not None else b""
    else:
        ca_cert, ca_key, previous = certs.ca_cert, certs.ca_key, certs.previous_ca
    tls_cert, tls_key = _issue_serving(ca_cert, ca_key, hosts, now)
    return Certificates(ca_cert, ca_key, tls_cert, tls_key, previous)


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> list[str]:
    """The names the API server may use for the webhook's Service, then ``extra``."""
    names = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local",
             f"{service}.{namespace}", service]
    return names + [h for h in extra if h not in names]


def _not_after(pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {*san.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}


def _key() -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return key, pem


def _issue_ca(now: datetime.datetime) -> tuple[bytes, bytes]:
    key, key_pem = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                         f"dispatcher-webhook-ca-{now:%Y%m%d%H%M%S}")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _issue_serving(ca_cert_pem: bytes, ca_key_pem: bytes, hosts: Sequence[str],
                   now: datetime.datetime) -> tuple[bytes, bytes]:
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA's key is not an EC key")
    key, key_pem = _key()
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    not_after = min(now + SERVING_LIFETIME, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SecretCertificates:
    """The certificates in Secret ``namespace/name``, renewed when due, and their CA
    patched into the webhook configurations named ``configuration``."""

    MAX_ATTEMPTS = 5

    def __init__(self, kube: Kube, namespace: str, name: str, hosts: Sequence[str],
                 configuration: str | None, pods_configuration: str | None = None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.hosts = list(hosts)
        self.configuration = configuration
        # The pod webhook's MutatingWebhookConfiguration (pods/pod_pinning.py): optional, so
        # its absence is no warning.
        self.pods_configuration = pods_configuration

    async def current(self, now: datetime.datetime | None = None) -> Certificates:
        """The certificates to serve, renewed first if due. Another replica renewing at
        the same moment makes our write conflict: theirs is read and used."""
        for _ in range(self.MAX_ATTEMPTS):
            now = now or _now()
            secret = await self._read()
            certs = Certificates.from_secret_data((secret or {}).get("data") or {})
            reason = plan_renewal(certs, self.hosts, now)
            if reason is None:
                assert certs is not None
                return certs
            fresh = renew(certs, self.hosts, now)
            try:
                await self._write(secret, fresh)
            except ApiError as e:
                if e.status == 409:
                    continue  # another replica wrote first
                raise
            log.info("webhook certificate in Secret %s/%s renewed: %s", self.namespace,
                     self.name, reason)
            return fresh
        raise RuntimeError(f"Secret {self.namespace}/{self.name} kept changing while the "
                           "webhook certificate was being renewed")

    async def _read(self) -> dict[str, Any] | None:
        try:
            secret: dict[str, Any] = await self.kube.request(
                "GET", SECRETS.path(self.namespace, self.name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return secret

    async def _write(self, existing: dict[str, Any] | None, certs: Certificates) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/name": "dispatcher",
                                    "app.kubernetes.io/component": "webhook"}},
            "data": certs.secret_data(),
        }
        if existing is None:
            await self.kube.request("POST", SECRETS.path(self.namespace), body)
            return
        # The resourceVersion makes a concurrent renewal by another replica a conflict.
        meta = existing.get("metadata") or {}
        body["metadata"] = {**meta, "resourceVersion": meta.get("resourceVersion")}
        await self.kube.request("PUT", SECRETS.path(self.namespace, self.name), body)

    async def publish(self, certs: Certificates, now: datetime.datetime | None = None
                      ) -> int:
        """Patch the CA bundle into every webhook of the configurations that does not
        carry it yet; returns the number of webhooks patched."""
        bundle = base64.b64encode(certs.ca_bundle(now or _now())).decode()
        patched = 0
        targets = [(r, self.configuration) for r in (MUTATING, VALIDATING)
                   if self.configuration is not None]
        if self.pods_configuration is not None:
            targets.append((MUTATING, self.pods_configuration))
        for resource, name in targets:
            path = resource.path(name=name)
            try:
                config = await self.kube.request("GET", path)
            except ApiError as e:
                if e.status == 404 and name == self.configuration:
                    log.warning("%s %s not found: the API server will not call this "
                                "webhook (apply deploy/ or pass --webhook-configuration)",
                                resource.kind, name)
                    continue
                if e.status in (403, 404) and name != self.configuration:
                    # The pod webhook is optional (deploy/components/pod-webhook): not
                    # installed, or not this service account's to patch.
                    log.debug("%s %s not patched: %s", resource.kind, name, e)
                    continue
                raise
            ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                    "value": bundle}
                   for i, hook in enumerate(config.get("webhooks") or [])
                   if (hook.get("clientConfig") or {}).get("caBundle") != bundle]
            if not ops:
                continue
            # The test op makes a concurrent edit of the list fail instead of patching the
            # wrong entry.
            version = (config.get("metadata") or {}).get("resourceVersion")
            await self.kube.request(
                "PATCH", path, [{"op": "test", "path": "/metadata/resourceVersion",
                                 "value": version}, *ops],
                content_type="application/json-patch+json")
            patched += len(ops)
        if patched:
            log.info("CA bundle patched into %d webhook(s) of %s", patched,
                     " and ".join(dict.fromkeys(name for _, name in targets)))
        if self.configuration is not None:
            patched += await self._publish_conversion(bundle)
        return patched

    async def _publish_conversion(self, bundle: str) -> int:
        """Patch the CA bundle into the AppWrapper CRD's conversion webhook, when it is
        this namespace's service that converts; 1 if patched."""
        path = CRDS.path(name=APPWRAPPER_CRD)
        try:
            crd = await self.kube.request("GET", path)
        except ApiError as e:
            if e.status in (403, 404):
                log.warning("CRD %s not read (%s): AppWrapper v1beta2 cannot be served until "
                            "its conversion webhook trusts this CA", APPWRAPPER_CRD, e)
                return 0
            raise
        conversion = (crd.get("spec") or {}).get("conversion") or {}
        config = (conversion.get("webhook") or {}).get("clientConfig") or {}
        if conversion.get("strategy") != "Webhook" or \
                (config.get("service") or {}).get("namespace") != self.namespace or \
                config.get("caBundle") == bundle:
            return 0
        version = (crd.get("metadata") or {}).get("resourceVersion")
        await self.kube.request(
            "PATCH", path, [{"op": "test", "path": "/metadata/resourceVersion",
                             "value": version},
                            {"op": "add", "path": "/spec/conversion/webhook/clientConfig/caBundle",
                             "value": bundle}],
            content_type="application/json-patch+json")
        log.info("CA bundle patched into the conversion webhook of CRD %s", APPWRAPPER_CRD)
        return 1
