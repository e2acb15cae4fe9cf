"""Log output for a worker process: text or JSON lines, with the standard ``logging`` module.

Records about a step carry their context (workflow class and id, hero, execution id, step,
and for a state change ``transition`` and ``reason``) as ``record.geneva_drive``
(``core.events``); the text format shows it as the message's ``[key=value ...]`` prefix, the
JSON format also as fields of the line.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"

# The fields a line always has; a context field of the same name does not replace them.
_BASE = ("time", "level", "logger", "message")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = getattr(record, "geneva_drive", None)
        if isinstance(context, dict):
            for key, value in context.items():
                if value is not None and key not in _BASE:
                    line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup(log_format: str = "text", level: str = "INFO") -> None:
    """Send the root logger's records to stderr in ``log_format`` from ``level`` up.

    Replaces handlers installed before (a second call changes the format, not doubles it).
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: expected one of {', '.join(FORMATS)}")
    if level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the startup revision check
