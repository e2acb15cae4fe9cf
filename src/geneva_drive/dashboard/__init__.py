"""The web dashboard: ``create_app(engine=..., authorize=...)`` returns a Starlette app.

Needs the ``dashboard`` extra (``pip install 'geneva-drive[dashboard]'``). Importing this
package does not import Starlette; ``create_app`` does, so ``geneva-drive --help`` works
without the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from geneva_drive.dashboard.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name != "create_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from geneva_drive.dashboard.app import create_app
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"geneva_drive.dashboard needs {error.name!r}, which is not installed; install the "
            "dashboard extra: pip install 'geneva-drive[dashboard]'",
            name=error.name,
        ) from error
    return create_app
