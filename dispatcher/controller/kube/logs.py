"""The log of `dispatcher run` and `dispatcher webhook`: text lines (the default), or one
JSON object a line (``--log-format json``) for log collectors that index fields.

A JSON line has ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``
and, when there is one, ``exception`` (the traceback as text): a record is always one line,
whatever newlines its message or traceback hold.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str, verbose: bool, quiet: Iterable[str] = ()) -> None:
    """Log to stderr in `log_format`, at DEBUG with `verbose`, else INFO with the
    `quiet` loggers (chatty libraries) at WARNING."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    if not verbose:
        for name in quiet:
            logging.getLogger(name).setLevel(logging.WARNING)
