"""Names a package exports but imports only when first used (PEP 562).

Why: ``import geneva_drive`` (and ``geneva_drive.admin``, ``runtime.backends``) must not import
SQLAlchemy, Alembic or Celery before a command needs them — every ``geneva-drive`` command
would pay for them at start (issue 42). Each such package keeps a table of where each name
lives and delegates its module ``__getattr__`` here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def load(package: str, exports: Mapping[str, str], namespace: dict[str, Any], name: str) -> Any:
    """``name`` from the module ``exports`` says it lives in, kept in ``namespace`` (the
    package's globals) so the next lookup is a plain attribute."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
