"""Values the application hands geneva-drive to keep: a workflow's input, a step's result.

Both are typed JSON (:mod:`~geneva_drive.storage.serialization`, the codec of signal payloads)
of at most ``max_value_size`` bytes once encoded (64 KiB by default, ``configure()``). The
check runs before anything is written, so a refused value leaves the database unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from geneva_drive.core.errors import PayloadTooLargeError, SerializationError
from geneva_drive.storage import serialization


def size_of(encoded: Any) -> int:
    """Bytes of the UTF-8 JSON stored for an already encoded value."""
    return len(
        json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )


def stored_value(
    value: Any,
    *,
    limit: int | None,
    what: str,
    too_large: type[PayloadTooLargeError],
) -> Any:
    """``value`` encoded for storage (None stays None), or a clear error naming ``what``.

    ``what`` says whose value it is, e.g. ``"Refund.create(input=...)"``.
    """
    if value is None:
        return None
    try:
        encoded = serialization.encode(value)
    except SerializationError as error:
        raise type(error)(f"{what}: {error}") from None
    if limit is not None:
        size = size_of(encoded)
        if size > limit:
            raise too_large(
                f"{what}: the value is {size} bytes of JSON, over max_value_size={limit}; "
                "keep large data elsewhere (a row of your own, a file) and store its key, or "
                "raise the limit with configure(max_value_size=...)"
            )
    return encoded
