"""The webhook's certificates: made, kept in a Secret shared by replicas, rotated before
they expire, the CA published into the webhook configurations; and the HTTPS server that
serves AdmissionReviews with them and picks up a new certificate without a restart."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import ssl
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from dispatcher.controller.access.creator import CREATOR, Access
from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.webhook.admission_review import AppWrapperReview
from dispatcher.controller.webhook.certs import (
    APPWRAPPER_CRD,
    CRDS,
    MUTATING,
    SECRETS,
    VALIDATING,
    Certificates,
    SecretCertificates,
    plan_renewal,
    renew,
    service_hosts,
)
from dispatcher.controller.webhook.server import (
    CONVERT_PATH,
    MUTATE_PATH,
    VALIDATE_PATH,
    WebhookServer,
    directory_source,
    secret_source,
)

from .fake_authz import FakeApi

NOW = datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
HOSTS = service_hosts("dispatcher-webhook", "dispatcher-system", ["127.0.0.1"])


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_new_certificates_name_the_service_and_chain_to_the_ca() -> None:
    assert plan_renewal(None, HOSTS, NOW) == "no certificate yet"
    certs = renew(None, HOSTS, NOW)
    serving, ca = cert(certs.tls_cert), cert(certs.ca_cert)
    serving.verify_directly_issued_by(ca)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "dispatcher-webhook.dispatcher-system.svc",
        "dispatcher-webhook.dispatcher-system.svc.cluster.local",
        "dispatcher-webhook.dispatcher-system", "dispatcher-webhook"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert serving.not_valid_after_utc - NOW == datetime.timedelta(days=90)
    assert plan_renewal(certs, HOSTS, NOW) is None
    assert plan_renewal(certs, HOSTS, NOW + 59 * DAY) is None


def test_the_serving_certificate_is_renewed_30_days_before_it_expires_by_the_same_ca() -> None:
    certs = renew(None, HOSTS, NOW)
    later = NOW + 61 * DAY
    assert plan_renewal(certs, HOSTS, later) == \
        "the serving certificate expires in 29 days"
    renewed = renew(certs, HOSTS, later)
    assert renewed.ca_cert == certs.ca_cert and renewed.ca_key == certs.ca_key
    assert renewed.tls_cert != certs.tls_cert and renewed.previous_ca == b""
    cert(renewed.tls_cert).verify_directly_issued_by(cert(certs.ca_cert))
    assert plan_renewal(renewed, HOSTS, later) is None


def test_a_missing_host_renews_the_serving_certificate() -> None:
    certs = renew(None, HOSTS, NOW)
    assert plan_renewal(certs, [*HOSTS, "10.0.0.1"], NOW) == \
        "the serving certificate does not name 10.0.0.1"


def test_the_ca_is_replaced_a_year_before_it_expires_and_the_old_one_stays_trusted() -> None:
    certs = renew(None, HOSTS, NOW)
    late = NOW + 9 * 365 * DAY + 30 * DAY
    assert plan_renewal(certs, HOSTS, late) == "the CA expires in 335 days"
    renewed = renew(certs, HOSTS, late)
    assert renewed.ca_cert != certs.ca_cert and renewed.previous_ca == certs.ca_cert
    cert(renewed.tls_cert).verify_directly_issued_by(cert(renewed.ca_cert))
    assert renewed.ca_bundle(late) == renewed.ca_cert + certs.ca_cert
    assert renewed.ca_bundle(NOW + 3651 * DAY) == renewed.ca_cert  # the old one expired


def test_certificates_round_trip_through_a_secret_and_garbage_is_renewed() -> None:
    certs = renew(None, HOSTS, NOW)
    assert Certificates.from_secret_data(certs.secret_data()) == certs
    assert Certificates.from_secret_data({}) is None
    broken = {**certs.secret_data(), "tls.crt": base64.b64encode(b"nonsense").decode()}
    assert Certificates.from_secret_data(broken) is None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def configs(api: FakeApi, name: str = "dispatcher-appwrappers") -> None:
    for resource in (MUTATING, VALIDATING):
        api.put(resource.path(name=name), {
            "metadata": {"name": name},
            "webhooks": [{"name": "a", "clientConfig": {"url": "https://127.0.0.1:1/x"}},
                         {"name": "b", "clientConfig": {"url": "https://127.0.0.1:1/y"}}]})


def store(api: FakeApi) -> SecretCertificates:
    return SecretCertificates(api, "dispatcher-system", "dispatcher-webhook-cert",  # type: ignore[arg-type]
                              HOSTS, "dispatcher-appwrappers")


def test_replicas_share_the_certificate_in_the_secret() -> None:
    api = FakeApi()
    first = run(store(api).current(NOW))
    secret = api.objects[SECRETS.path("dispatcher-system", "dispatcher-webhook-cert")]
    assert Certificates.from_secret_data(secret["data"]) == first
    assert run(store(api).current(NOW)) == first  # a second replica, or a restart
    assert [m for m, _ in api.requests].count("POST") == 1


def test_a_replica_that_loses_the_renewal_race_uses_the_winners_certificate() -> None:
    api = FakeApi()
    run(store(api).current(NOW))
    later = NOW + 70 * DAY
    winner: list[Certificates] = []

    def other_replica_renews() -> None:
        api.before_write = None
        winner.append(run_sync(store(api).current(later)))

    api.before_write = other_replica_renews
    got = run(store(api).current(later))
    assert got == winner[0]
    secret = api.objects[SECRETS.path("dispatcher-system", "dispatcher-webhook-cert")]
    assert Certificates.from_secret_data(secret["data"]) == got


def run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from inside a fake's synchronous hook."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the fake API never suspends")


def test_the_ca_is_patched_into_every_webhook_once() -> None:
    api = FakeApi()
    configs(api)
    s = store(api)
    certs = run(s.current(NOW))
    assert run(s.publish(certs, NOW)) == 4
    bundle = base64.b64encode(certs.ca_cert).decode()
    for resource in (MUTATING, VALIDATING):
        hooks = api.objects[resource.path(name="dispatcher-appwrappers")]["webhooks"]
        assert [h["clientConfig"]["caBundle"] for h in hooks] == [bundle, bundle]
        assert hooks[0]["clientConfig"]["url"] == "https://127.0.0.1:1/x"
    assert run(s.publish(certs, NOW)) == 0


def appwrapper_crd(namespace: str = "dispatcher-system") -> dict[str, Any]:
    return {"metadata": {"name": APPWRAPPER_CRD, "resourceVersion": "7"},
            "spec": {"conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"], "clientConfig": {"service": {
                    "namespace": namespace, "name": "dispatcher-webhook",
                    "path": "/convert-appwrappers"}}}}}}


def test_the_ca_is_patched_into_the_crds_conversion_webhook_once() -> None:
    api = FakeApi()
    configs(api)
    api.put(CRDS.path(name=APPWRAPPER_CRD), appwrapper_crd())
    s = store(api)
    certs = run(s.current(NOW))
    assert run(s.publish(certs, NOW)) == 5
    crd = api.objects[CRDS.path(name=APPWRAPPER_CRD)]
    config = crd["spec"]["conversion"]["webhook"]["clientConfig"]
    assert base64.b64decode(config["caBundle"]) == certs.ca_cert
    assert run(s.publish(certs, NOW)) == 0


def test_a_crd_converted_by_another_installation_or_unreadable_is_left_alone() -> None:
    api = FakeApi()
    configs(api)
    api.put(CRDS.path(name=APPWRAPPER_CRD), appwrapper_crd("elsewhere"))
    s = store(api)
    certs = run(s.current(NOW))
    assert run(s.publish(certs, NOW)) == 4
    assert "caBundle" not in api.objects[CRDS.path(name=APPWRAPPER_CRD)]["spec"][
        "conversion"]["webhook"]["clientConfig"]
    api.fail[("GET", CRDS.path(name=APPWRAPPER_CRD))] = ApiError(403, "Forbidden", "no")
    assert run(s.publish(certs, NOW)) == 0


def test_the_pod_webhooks_configuration_gets_the_ca_and_may_be_absent_or_forbidden() -> None:
    api = FakeApi()
    configs(api)
    api.put(MUTATING.path(name="dispatcher-pods"), {
        "metadata": {"name": "dispatcher-pods"},
        "webhooks": [{"name": "p", "clientConfig": {"url": "https://127.0.0.1:1/pin-pods"}}]})
    s = SecretCertificates(api, "dispatcher-system", "dispatcher-webhook-cert",  # type: ignore[arg-type]
                           HOSTS, "dispatcher-appwrappers", "dispatcher-pods")
    certs = run(s.current(NOW))
    assert run(s.publish(certs, NOW)) == 5
    hook = api.objects[MUTATING.path(name="dispatcher-pods")]["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == certs.ca_cert
    # Optional: not installed, or RBAC that names only the AppWrapper configurations.
    del api.objects[MUTATING.path(name="dispatcher-pods")]
    assert run(s.publish(certs, NOW)) == 0
    api.fail[("GET", MUTATING.path(name="dispatcher-pods"))] = ApiError(403, "Forbidden", "no")
    assert run(s.publish(certs, NOW)) == 0
    # The AppWrapper configurations stay required.
    api.fail[("GET", VALIDATING.path(name="dispatcher-appwrappers"))] = ApiError(
        403, "Forbidden", "no")
    with pytest.raises(ApiError):
        run(s.publish(certs, NOW))


# --- the HTTPS server ------------------------------------------------------------------

ALICE = {"username": "alice", "uid": "u1", "groups": ["system:authenticated"]}


def review_body(operation: str = "CREATE") -> dict[str, Any]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "abc", "operation": operation, "namespace": "team-a", "userInfo": ALICE,
        "kind": {"group": "workload.codeflare.dev", "version": "v1beta1", "kind": "AppWrapper"},
        "object": {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                   "metadata": {"name": "aw", "namespace": "team-a"},
                   "spec": {"resources": {"GenericItems": [{"generictemplate": job}]}}}}}


def conversion_body() -> dict[str, Any]:
    obj = review_body()["request"]["object"]
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "c1", "desiredAPIVersion": "workload.codeflare.dev/v1beta2",
                        "objects": [obj]}}


def client_context(ca: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.decode())
    return ctx


async def peer_serial(host: str, port: int, ca: bytes) -> int:
    _, writer = await asyncio.open_connection(host, port, ssl=client_context(ca),
                                              server_hostname=host)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


def test_the_server_answers_admission_reviews_over_tls_and_reloads_its_certificate() -> None:
    async def scenario() -> None:
        api = FakeApi({"alice": {"jobs.batch"}})
        configs(api)
        s = store(api)
        server = WebhookServer(AppWrapperReview(Access(api)),  # type: ignore[arg-type]
                               secret_source(s), "127.0.0.1", 0)
        await server.start()
        try:
            ((host, port),) = server.addresses()
            certs = Certificates.from_secret_data(api.objects[SECRETS.path(
                "dispatcher-system", "dispatcher-webhook-cert")]["data"])
            assert certs is not None
            # The CA was published as the server started.
            hook = api.objects[VALIDATING.path(name="dispatcher-appwrappers")]["webhooks"][0]
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == certs.ca_cert
            base = f"https://{host}:{port}"
            ssl_ctx = client_context(certs.ca_cert)
            async with aiohttp.ClientSession() as http:
                async with http.post(base + MUTATE_PATH, json=review_body(), ssl=ssl_ctx) as r:
                    answer = await r.json()
                assert answer["apiVersion"] == "admission.k8s.io/v1"
                assert answer["kind"] == "AdmissionReview"
                response = answer["response"]
                assert response["uid"] == "abc" and response["allowed"] is True
                assert response["patchType"] == "JSONPatch"
                patch = json.loads(base64.b64decode(response["patch"]))
                assert patch[0]["value"][CREATOR] == "alice"
                body = review_body()
                body["request"]["object"]["metadata"]["annotations"] = patch[0]["value"]
                async with http.post(base + VALIDATE_PATH, json=body, ssl=ssl_ctx) as r:
                    assert (await r.json())["response"]["allowed"] is True
                body["request"]["userInfo"] = {"username": "bob"}
                async with http.post(base + VALIDATE_PATH, json=body, ssl=ssl_ctx) as r:
                    response = (await r.json())["response"]
                assert response["allowed"] is False and response["status"]["code"] == 403
                async with http.post(base + VALIDATE_PATH, data=b"{}", ssl=ssl_ctx) as r:
                    assert r.status == 400
                async with http.post(base + CONVERT_PATH, json=conversion_body(),
                                     ssl=ssl_ctx) as r:
                    answer = await r.json()
                assert answer["kind"] == "ConversionReview"
                assert answer["response"]["uid"] == "c1"
                assert answer["response"]["result"] == {"status": "Success"}
                (converted,) = answer["response"]["convertedObjects"]
                assert converted["apiVersion"] == "workload.codeflare.dev/v1beta2"
                assert converted["spec"]["components"][0]["template"]["kind"] == "Job"
                body = conversion_body()
                body["request"]["desiredAPIVersion"] = "workload.codeflare.dev/v9"
                async with http.post(base + CONVERT_PATH, json=body, ssl=ssl_ctx) as r:
                    result = (await r.json())["response"]["result"]
                assert result["status"] == "Failure"
                assert result["message"].startswith("AppWrapper team-a/aw: cannot convert")
                async with http.post(base + CONVERT_PATH, data=b"{}", ssl=ssl_ctx) as r:
                    assert r.status == 400
                async with http.get(base + "/healthz", ssl=ssl_ctx) as r:
                    assert r.status == 200
            before = await peer_serial(host, port, certs.ca_cert)
            assert before == cert(certs.tls_cert).serial_number
            # Another replica renewed the serving certificate: the next refresh serves it.
            renewed = renew(certs, [*HOSTS, "extra.example"], datetime.datetime.now(datetime.UTC))
            secret_path = SECRETS.path("dispatcher-system", "dispatcher-webhook-cert")
            api.put(secret_path, {**api.objects[secret_path], "data": renewed.secret_data()})
            s.hosts.append("extra.example")
            await server.refresh()
            assert await peer_serial(host, port, certs.ca_cert) == \
                cert(renewed.tls_cert).serial_number
        finally:
            await server.stop()

    run(scenario())


def test_the_server_serves_certificates_from_a_directory(tmp_path: Any) -> None:
    async def scenario() -> None:
        certs = renew(None, ["127.0.0.1"], datetime.datetime.now(datetime.UTC))
        (tmp_path / "tls.crt").write_bytes(certs.tls_cert)
        (tmp_path / "tls.key").write_bytes(certs.tls_key)
        api = FakeApi()
        server = WebhookServer(AppWrapperReview(Access(api)),  # type: ignore[arg-type]
                               directory_source(tmp_path), "127.0.0.1", 0)
        await server.start()
        try:
            ((host, port),) = server.addresses()
            assert await peer_serial(host, port, certs.ca_cert) == \
                cert(certs.tls_cert).serial_number
            assert api.requests == []  # nothing patched, no Secret
        finally:
            await server.stop()

    run(scenario())
