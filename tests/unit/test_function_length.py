"""The check `make lint` runs: no function over the limit in admission and controller."""

from __future__ import annotations

from pathlib import Path

from tests.function_length import main


def write_module(folder: Path, body_lines: int) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    (folder / "m.py").write_text(f"def f() -> None:\n{body}\n\nasync def g() -> None:\n    pass\n")


def test_a_function_over_the_limit_is_named_and_fails_the_check(
        tmp_path: Path, capsys: object) -> None:
    write_module(tmp_path, 60)  # 61 lines with its signature
    assert main(["--max", "60", str(tmp_path)]) == 1
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "m.py:1 f: 61 lines" in out and " g:" not in out


def test_a_function_at_the_limit_passes(tmp_path: Path) -> None:
    write_module(tmp_path, 59)
    assert main(["--max", "60", str(tmp_path)]) == 0


def test_the_admission_core_and_the_controller_have_none_over_the_limit() -> None:
    root = Path(__file__).resolve().parents[2]
    assert main([str(root / "dispatcher" / "admission"),
                 str(root / "dispatcher" / "controller")]) == 0
