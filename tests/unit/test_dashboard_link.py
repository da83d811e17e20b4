"""`kubectl appwrapper dashboard`, run as a user runs it, with a stand-in kubectl on the PATH
that records what it was asked and answers as a cluster would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STAND_IN = '''#!{python}
import json, os, sys
words = sys.argv[1:]
with open(os.environ["KUBECTL_LOG"], "a") as log:
    log.write(json.dumps(words) + "\\n")
if "get" in words and "service" in words:
    if os.environ.get("NO_SERVICE"):
        sys.stderr.write('Error from server (NotFound): services "dispatcher-metrics" '
                         'not found\\n')
        sys.exit(1)
    print("8080", end="")
elif "view" in words:
    print(os.environ.get("KUBECONFIG_TOKEN", ""), end="")
elif "create" in words and "token" in words:
    print("sa-token/made+here")
elif "port-forward" in words:
    print("Forwarding from 127.0.0.1:43117 -> 8080")
    print("Forwarding from [::1]:43117 -> 8080")
'''


@pytest.fixture
def kubectl(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "kubectl"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    return bin_dir


def plugin(path: str, log: Path, *argv: str,
           **env: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from dispatcher.cli import kubectl_plugin; sys.exit(kubectl_plugin())"
    # The stand-in kubectl reads no kubeconfig, but the plugin wants one to exist.
    kubeconfig = log.parent / "kubeconfig"
    kubeconfig.touch()
    environment = {**os.environ, "PATH": path, "KUBECTL_LOG": str(log),
                   "KUBECONFIG": str(kubeconfig), **env}
    return subprocess.run([sys.executable, "-c", code, "dashboard", *argv], env=environment,
                          capture_output=True, text=True, timeout=60, check=False)


def asked(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_kubeconfig_token_goes_in_the_fragment(kubectl: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = plugin(str(kubectl), log, KUBECONFIG_TOKEN="user-token")
    assert done.returncode == 0, done.stderr
    assert "http://127.0.0.1:43117/dashboard/#token=user-token" in done.stdout
    assert "?" not in done.stdout.split("http://")[1].split()[0]
    forwards = [w for w in asked(log) if "port-forward" in w]
    assert forwards == [["port-forward", "-n", "dispatcher-system",
                         "service/dispatcher-metrics", ":8080"]]


def test_service_account_token_is_made_and_quoted(kubectl: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = plugin(str(kubectl), log, "--service-account", "viewer",
                  "--service-account-namespace", "team-a", "--port", "9000")
    assert done.returncode == 0, done.stderr
    assert "#token=sa-token%2Fmade%2Bhere" in done.stdout
    words = asked(log)
    assert ["create", "token", "viewer", "-n", "team-a"] in words
    assert next(w for w in words if "port-forward" in w)[-1] == "9000:8080"


def test_explicit_token_asks_kubectl_for_none(kubectl: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = plugin(str(kubectl), log, "--token", "mine", "--context", "prod")
    assert done.returncode == 0, done.stderr
    assert "#token=mine" in done.stdout
    assert not [w for w in asked(log) if "token" in w or "view" in w]
    assert all(w[:2] == ["--context", "prod"] for w in asked(log))


def test_no_token_anywhere_says_what_to_pass(kubectl: Path, tmp_path: Path) -> None:
    done = plugin(str(kubectl), tmp_path / "log")
    assert done.returncode == 1
    assert "has no token: pass --token, or --service-account" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_service_is_a_clear_error(kubectl: Path, tmp_path: Path) -> None:
    done = plugin(str(kubectl), tmp_path / "log", "--token", "t", "-n", "elsewhere",
                  NO_SERVICE="1")
    assert done.returncode == 1
    assert "no Service dispatcher-metrics in namespace elsewhere" in done.stderr
    assert "is the dispatcher installed there?" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_kubectl_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = plugin(str(empty), tmp_path / "log", "--token", "t")
    assert done.returncode == 1
    assert "kubectl is not on the PATH: install it" in done.stderr
    assert "Traceback" not in done.stderr


def test_open_hands_the_address_to_the_browser(kubectl: Path, tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    browser = kubectl / "browser"
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {opened}\n")
    browser.chmod(0o755)
    done = plugin(str(kubectl), tmp_path / "log", "--token", "t", "--open",
                  BROWSER=f"{browser} %s")
    assert done.returncode == 0, done.stderr
    assert opened.read_text().strip() == "http://127.0.0.1:43117/dashboard/#token=t"
