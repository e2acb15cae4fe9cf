"""Reading what the browser sent: the workflow filter from a query string, POSTed forms.

Forms arrive URL-encoded (the dashboard's own forms never upload files), so the body is parsed
here with the standard library rather than with an extra multipart dependency.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from geneva_drive.admin import AdminInputError, WorkflowFilter
from geneva_drive.core.states import WorkflowState

STATES = tuple(state.value for state in WorkflowState)
MAX_FORM_BYTES = 256 * 1024  # a signal payload is capped at 128 KiB by default


@dataclass(frozen=True)
class FilterForm:
    """The workflows page's filter fields, as typed; ``to_filter()`` checks and converts."""

    type: str = ""
    state: tuple[str, ...] = ()
    hero_type: str = ""
    hero_id: str = ""
    step: str = ""
    error: str = ""
    signal: str = ""
    created_after: str = ""
    created_before: str = ""
    changed_after: str = ""  # transitioned_at: when it finished, was canceled or paused
    changed_before: str = ""
    failed: str = ""  # "", "yes" or "no"

    @classmethod
    def from_items(cls, items: Iterable[tuple[str, str]]) -> FilterForm:
        values: dict[str, Any] = {}
        states: list[str] = []
        names = {f.name for f in fields(cls)}
        for key, value in items:
            value = value.strip()
            if key == "state":
                states.extend(s for s in value.split(",") if s)
            elif key in names and value:
                values[key] = value
        return cls(state=tuple(dict.fromkeys(states)), **values)

    @property
    def empty(self) -> bool:
        return self == FilterForm()

    @property
    def beyond_hero_id(self) -> bool:
        """Whether a field other than the hero search is set (the page then shows them all)."""
        return any(key != "hero_id" for key, _ in self.items())

    @property
    def filters_set(self) -> int:
        """How many fields other than the hero search are set (a state list counts once): what
        the collapsed "More filters" says, so a phone shows the rows first and still tells."""
        return len({key for key, _ in self.items() if key != "hero_id"})

    def items(self) -> list[tuple[str, str]]:
        """The non-empty fields as query items, to carry the filter into links and forms."""
        pairs: list[tuple[str, str]] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "state":
                pairs.extend(("state", s) for s in value)
            elif value:
                pairs.append((f.name, value))
        return pairs

    def query(self, **extra: str) -> str:
        return urlencode(self.items() + [(k, v) for k, v in extra.items() if v])

    def to_filter(self) -> WorkflowFilter:
        bad = [s for s in self.state if s not in STATES]
        if bad:
            raise AdminInputError(
                f"state={bad[0]!r} is not a workflow state; expected one of {', '.join(STATES)}"
            )
        if self.failed not in ("", "yes", "no"):
            raise AdminInputError(f"failed={self.failed!r}: expected yes, no or nothing")
        return WorkflowFilter(
            workflow_type=self.type or None,
            state=(self.state[0] if len(self.state) == 1 else self.state) or None,
            hero_type=self.hero_type or None,
            hero_id=self.hero_id or None,
            current_step=self.step or None,
            error_class=self.error or None,
            awaiting_signal=self.signal or None,
            created_after=_moment("created_after", self.created_after),
            created_before=_moment("created_before", self.created_before),
            transitioned_after=_moment("changed_after", self.changed_after),
            transitioned_before=_moment("changed_before", self.changed_before),
            has_failed_execution={"": None, "yes": True, "no": False}[self.failed],
        )


def _moment(name: str, text: str) -> datetime | None:
    """An ISO 8601 date or time; without a zone it is UTC (what the page shows)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise AdminInputError(
            f"{name}={text!r} is not a date or time; expected ISO 8601 such as "
            "2026-12-01 or 2026-12-01T08:30 (UTC)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def parse_body(body: bytes) -> list[tuple[str, str]]:
    if len(body) > MAX_FORM_BYTES:
        raise AdminInputError(
            f"the form is {len(body):,} bytes; the dashboard accepts at most {MAX_FORM_BYTES:,}"
        )
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise AdminInputError("the form is not UTF-8 encoded") from None


def first(items: Iterable[tuple[str, str]], key: str) -> str | None:
    return next((value for k, value in items if k == key), None)


def optional_text(form: Mapping[str, str], key: str) -> str | None:
    value = form.get(key, "").strip()
    return value or None
