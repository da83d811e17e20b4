"""A progress bar on a text stream, without dependencies: one line redrawn with \\r."""

from __future__ import annotations

import time
from typing import TextIO


class ProgressBar:
    """Redraws at most every `interval` seconds; `close` ends the line."""

    def __init__(self, stream: TextIO, label: str = "simulating", width: int = 30,
                 interval: float = 0.2) -> None:
        self.stream = stream
        self.label = label
        self.width = width
        self.interval = interval
        self._last = -float("inf")
        self._drawn = False
        self._start = time.monotonic()

    def __call__(self, done: int, total: int, trace_seconds: float) -> None:
        now = time.monotonic()
        if now - self._last < self.interval and done < total:
            return
        self._last = now
        fraction = done / total if total else 1.0
        filled = round(self.width * fraction)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {fraction:4.0%} {done:,}/{total:,} jobs arrived, "
            f"trace day {trace_seconds / 86400:.1f}, {now - self._start:.0f}s "
        )
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
