"""`--log-format json`: one JSON object a line, for log collectors that index fields."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.cli import build_parser
from dispatcher.controller.kube.logs import JsonFormatter

from .test_kube_client import kubeconfig


def record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("dispatcher", logging.WARNING, __file__, 1, message, args,
                             exc_info)


def test_a_record_is_one_json_line_with_its_fields() -> None:
    line = JsonFormatter().format(record("wrapper %s:\nwaits", "team-a/x"))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["level"] == "WARNING"
    assert fields["logger"] == "dispatcher"
    assert fields["message"] == "wrapper team-a/x:\nwaits"
    assert fields["time"].endswith("Z")
    assert "exception" not in fields


def test_an_exception_goes_into_the_same_line() -> None:
    try:
        raise ValueError("bad value")
    except ValueError as e:
        line = JsonFormatter().format(record("failed", exc=e))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["message"] == "failed"
    assert "Traceback" in fields["exception"] and "ValueError: bad value" in fields["exception"]


def test_run_and_webhook_take_the_log_format_and_refuse_others(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["run"]).log_format == "text"
    assert parser.parse_args(["run", "--log-format", "json"]).log_format == "json"
    assert parser.parse_args(["webhook", "--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["run", "--log-format", "yaml"])
    assert exit_.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_dispatcher_run_logs_json_lines(tmp_path: Path) -> None:
    """The first thing `dispatcher run` logs (before it reaches the cluster) is JSON."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "run", "--log-format", "json",
         "--metrics-port", "0", "--kubeconfig", kubeconfig(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait()
    fields = json.loads(first)
    assert fields["logger"] == "dispatcher" and fields["level"] == "INFO"
    assert fields["message"].startswith("kinds AppWrappers may wrap:")
