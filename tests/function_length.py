"""`make lint`: no function in the admission core or the controller is longer than
MAX_LINES lines (signature, docstring and body), so each reads as steps on one screen.

Usage: python -m tests.function_length [--max 60] [folder ...]
Prints each function over the limit (path:line name, its length) and exits 1 if any is.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 60
FOLDERS = ("dispatcher/admission", "dispatcher/controller")


def long_functions(path: Path, limit: int) -> Iterator[tuple[int, str, int]]:
    """(line, name, length) of each function in `path` longer than `limit` lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                yield node.lineno, node.name, length


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=MAX_LINES)
    ap.add_argument("folders", nargs="*", default=list(FOLDERS))
    args = ap.parse_args(argv)
    found = [(path, line, name, length)
             for folder in args.folders for path in sorted(Path(folder).rglob("*.py"))
             for line, name, length in long_functions(path, args.max)]
    for path, line, name, length in found:
        print(f"{path}:{line} {name}: {length} lines (at most {args.max}; split it into steps)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
