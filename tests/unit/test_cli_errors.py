"""Every command that reads the cluster says what went wrong in the same one line a user
can act on (server not reached, certificate not trusted, credentials refused), and `run`
gives up when told to; run as a user runs them, in a subprocess."""

from __future__ import annotations

import datetime
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.unit.stand_in_api import stand_in

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent
WRAPPER = str(EXAMPLES / "demo" / "07-job.yaml")

#: Each verb that talks to the API server, as typed (the kubectl plugin's too).
VERBS = (
    ("dispatcher", "queue"), ("dispatcher", "why", "x"), ("dispatcher", "hold", "x"),
    ("dispatcher", "release", "x"), ("dispatcher", "cancel", "x"),
    ("dispatcher", "plan", "--live", "-f", WRAPPER),
    ("kubectl-appwrapper", "why", "x"), ("kubectl-appwrapper", "plan", "-f", WRAPPER),
)


def run(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / str(argv[0])), *map(str, argv[1:])],
                          capture_output=True, text=True, timeout=timeout, check=False)


class Unauthorized(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _refuse(self) -> None:
        body = (b'{"kind":"Status","apiVersion":"v1","status":"Failure",'
                b'"message":"Unauthorized","reason":"Unauthorized","code":401}')
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _refuse


@pytest.mark.parametrize("argv", VERBS, ids=" ".join)
def test_refused_credentials_read_the_same_in_every_verb(argv: tuple[str, ...],
                                                        tmp_path: Path) -> None:
    with stand_in(Unauthorized, tmp_path, namespace="team-a") as kubeconfig:
        done = run(*argv, "--kubeconfig", kubeconfig)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "refused the credentials (401 Unauthorized)" in line, line
    assert "the token or certificate is expired, revoked or wrong" in line, line


@pytest.mark.parametrize("argv", VERBS, ids=" ".join)
def test_a_server_nothing_listens_on_reads_the_same_in_every_verb(
        argv: tuple[str, ...], tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path, "https://127.0.0.1:1", insecure=True)
    done = run(*argv, "--kubeconfig", kubeconfig)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot reach the API server at https://127.0.0.1:1" in line, line
    assert "is it running" in line and "ClientConnectorError" in line, line


def _kubeconfig(where: Path, server: str, insecure: bool = False) -> Path:
    cluster: dict[str, object] = {"server": server}
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    path = where / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u",
                                               "namespace": "team-a"}}]}))
    return path


@contextmanager
def self_signed_server(where: Path) -> Iterator[str]:
    """An HTTPS server whose certificate no CA signed; its URL."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]),
                critical=False)
            .sign(key, hashes.SHA256()))
    (where / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(where / "tls.crt", where / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_self_signed_certificate_points_at_the_ca_not_at_a_server_down(
        tmp_path: Path) -> None:
    with self_signed_server(tmp_path) as url:
        kubeconfig = _kubeconfig(tmp_path, url)
        for argv in (("dispatcher", "queue"), ("dispatcher", "why", "x")):
            done = run(*argv, "--kubeconfig", kubeconfig)
            assert done.returncode == 1, done.stderr
            (line,) = done.stderr.splitlines()
            assert "certificate is not trusted" in line, line
            assert "--certificate-authority=CA.crt" in line, line
            assert "is it running" not in line, line
        done = run("dispatcher", "run", "--kubeconfig", kubeconfig, "--metrics-port", "0",
                   "--startup-deadline", "2")
    assert done.returncode == 4, done.stderr
    assert "(--startup-deadline): cannot reach the API server" in done.stderr
    assert "certificate is not trusted" in done.stderr


def test_run_gives_up_after_its_startup_deadline_saying_why(tmp_path: Path) -> None:
    with stand_in(Unauthorized, tmp_path) as kubeconfig:
        done = run("dispatcher", "run", "--kubeconfig", kubeconfig, "--metrics-port", "0",
                   "--startup-deadline", "2")
    assert done.returncode == 4, done.stderr
    assert "not started after 2s (--startup-deadline)" in done.stderr, done.stderr
    assert "refused the credentials (401 Unauthorized)" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_a_deadline_run_says_it_keeps_retrying_and_how_to_bound_it(
        tmp_path: Path) -> None:
    with stand_in(Unauthorized, tmp_path) as kubeconfig:
        proc = subprocess.Popen([str(BIN / "dispatcher"), "run", "--kubeconfig",
                                 str(kubeconfig), "--metrics-port", "0"],
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            line = ""
            while "WARNING" not in line:  # the first warning: the API server refused it
                line = proc.stderr.readline()
                assert line, "dispatcher run exited without a warning"
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert "retrying until it answers (--startup-deadline SECONDS gives up)" in line, line
    assert proc.returncode == 0


def test_run_with_the_webhook_gives_up_after_its_startup_deadline_too(tmp_path: Path) -> None:
    """`run --webhook-port` starts the webhook first: the deadline bounds that step too."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with stand_in(Unauthorized, tmp_path) as kubeconfig:
        done = run("dispatcher", "run", "--kubeconfig", kubeconfig, "--metrics-port", "0",
                   "--webhook-port", str(port), "--webhook-host", "127.0.0.1",
                   "--startup-deadline", "2")
    assert done.returncode == 4, done.stderr
    assert "starting the webhook: the API server at" in done.stderr
    assert "refused the credentials (401 Unauthorized)" in done.stderr
    assert "the webhook not started after 2 s (--startup-deadline)" in done.stderr
    assert "Traceback" not in done.stderr
