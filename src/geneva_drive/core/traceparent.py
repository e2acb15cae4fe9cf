"""Reading a stored W3C traceparent (``00-<trace id>-<span id>-<flags>``) without OpenTelemetry.

A leaf of ``core``: ``admin.show`` prints a workflow's trace id and must not import the engine
(a reading command's start-up, issue 42); ``engine.tracing`` uses it too.
"""

from __future__ import annotations


def trace_id(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a stored W3C traceparent; None if none or malformed."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    try:
        valid = int(parts[1], 16) != 0
    except ValueError:
        return None
    return parts[1].lower() if valid else None
