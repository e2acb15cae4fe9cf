"""The admin API's errors: bad operator input, an unknown id, a refused action.

GenevaDriveError
├── AdminInputError     a filter, cursor, actor or action argument that cannot be used
├── AdminNotFound       no workflow with that id
└── InvalidStateError
    └── AdminRefused    the workflow's state does not allow the action (nothing written)
"""

from __future__ import annotations

from ..errors import GenevaDriveError, InvalidStateError


class AdminInputError(GenevaDriveError, ValueError):
    """An admin call got an argument it cannot use; the message says what it expected."""


class AdminNotFound(GenevaDriveError, LookupError):
    """No workflow has the given id."""


class AdminRefused(InvalidStateError):
    """An action the workflow's state does not allow; the database was left unchanged."""
