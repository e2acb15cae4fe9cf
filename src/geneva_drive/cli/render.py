"""What the operator commands print for people: Rich tables and one-line summaries.

Pure: each function turns an admin result into something to print, so what a command shows
can be read (and tested) apart from the database. :func:`console` is where it is printed:
fitted to a terminal, never wrapped or cut in a pipe or a file.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from geneva_drive import admin

if TYPE_CHECKING:
    from geneva_drive.runtime.deploy_check import Report

SHOWN_IDS = 20  # ids listed by a bulk action's summary before "… and N more"
ERROR_CHARACTERS = 120  # of an error message in the executions table
VALUE_CHARACTERS = 200  # of a workflow's input or a step's result, as JSON
# Not a terminal: lines as long as their content. Rich needs a width, and only fills what a
# table's cells measure (box=None, nothing padded to the full width), so a huge one is free.
PIPED_WIDTH = 1_000_000


def console(file: IO[str] | None = None, **options: Any) -> Console:
    """Where a command prints for people. On a terminal, its width: narrow columns fold. Into a
    pipe or a file, no wrapping and no truncation at all — without this Rich assumed 80
    columns and split names (``list | grep OrderFulfillment`` found nothing). Plain
    tab-separated output was the alternative; the same layout everywhere is simpler, and
    scripts have ``--json``.

    Every string printed is data (an error message, a hero id), never Rich markup or emoji
    codes: an error reading ``[/x]`` stopped ``show`` with a MarkupError, ``[bold]`` vanished,
    and ``:thumbs_up:`` became an emoji (not loading the emoji table also saves a `show` ~2 ms).
    Styles are given as ``Text(style=…)``."""
    plain = {"highlight": False, "markup": False, "emoji": False, **options}
    out = Console(file=file, **plain)
    if out.is_terminal:
        return out
    return Console(file=file, **{**plain, "width": PIPED_WIDTH})


def when(at: datetime | None) -> str:
    return "" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def _table(*columns: str, folding: tuple[str, ...] = ()) -> Table:
    """Columns named in ``folding`` wrap when the terminal is narrow; the others never do."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column not in folding)
    return table


def short(at: datetime | None) -> str:
    """A time within a timeline, where the year is seldom news."""
    return "" if at is None else at.strftime("%m-%d %H:%M:%S")


def _section(title: str, table: Table) -> Group:
    # A heading line, not Table(title=): a title wraps to the width of a narrow table.
    return Group(Text(title, style="bold"), table)


def _hero(item: admin.WorkflowSummary) -> str:
    return f"{item.hero_type}:{item.hero_id}" if item.hero_type else ""


# -- list ----------------------------------------------------------------------------------


def page(found: admin.Page, total: admin.BoundedCount | None) -> RenderableType:
    if not found.items:
        return Text("no workflows match")
    table = _table(
        "ID",
        "TYPE",
        "STATE",
        "STEP",
        "HERO",
        "WAITING FOR",
        "LAST ERROR",
        "UPDATED",
        folding=("TYPE", "STEP", "HERO", "WAITING FOR", "LAST ERROR"),
    )
    for item in found.items:
        table.add_row(
            str(item.id),
            item.workflow_type,
            item.state,
            item.current_step or "",
            _hero(item),
            item.awaiting_signal or "",
            item.last_error_class or "",
            when(item.updated_at),
        )
    shown = f"{len(found.items)} shown" + (f" of {total} matching" if total is not None else "")
    footer = [Text(shown)]
    if found.next_cursor:
        footer.append(Text(f"next page: --after {found.next_cursor}"))
    return Group(table, *footer)


# -- show ----------------------------------------------------------------------------------


def timeline(t: admin.Timeline) -> RenderableType:
    wf = t.workflow
    at = wf.current_step
    head = [
        Text(f"workflow {wf.id}  {wf.workflow_type}  {wf.state}", style="bold"),
        Text(f"hero: {_hero(wf) or '-'}   at step: {at or '-'}"),
        Text(f"created {when(wf.created_at)}   updated {when(wf.updated_at)}"),
    ]
    if t.trace_id:
        head.append(Text(f"trace {t.trace_id}"))
    if t.steps:
        head.append(Text("steps: " + " → ".join(f"[{s}]" if s == at else s for s in t.steps)))
    elif t.steps == ():
        head.append(Text(f"steps: unknown (no class with workflow_type {wf.workflow_type!r})"))
    if t.awaiting_signal:
        until = f" until {when(t.wait_deadline)}" if t.wait_deadline else ""
        head.append(Text(f"waiting for signal {t.awaiting_signal!r}{until}"))
    if t.input is not None:
        head.append(Text(f"input: {_value(t.input)}"))
    if t.compensating is not None:
        head.append(Text(f"canceling: compensating step {t.compensating!r}", style="bold"))
    parts: list[RenderableType] = [*head]
    if t.family is not None:
        parts += _family(t.family)
    parts += [Text(""), _executions(t)]
    results = [e for e in t.executions if e.result is not None]
    if results:
        parts += [Text(""), _results(results)]
    failure = next((e for e in reversed(t.executions) if e.error_class), None)
    if failure is not None:
        parts += [Text(""), *_failure(failure)]
    if t.signals:
        parts += [Text(""), _signals(t.signals)]
    if t.actions:
        parts += [Text(""), _actions(t.actions)]
    if wf.state == "paused":
        parts += [Text(""), Text(_paused_hint(wf.id))]
    return Group(*parts)


def _family(f: admin.Family) -> list[RenderableType]:
    lines: list[RenderableType] = []
    if f.parent is not None:
        p = f.parent
        lines.append(
            Text(f"parent: {p.id} {p.workflow_type} {p.state}   key: {f.key}   (show {p.id})")
        )
    if f.has_children:
        states = ", ".join(f"{n} {state}" for state, n in sorted(f.children_by_state.items()))
        lines.append(
            Text(
                f"children: {f.children_started} started, {f.children_ended} ended "
                f"({f.children_failed} canceled) — {states or 'none left'}"
            )
        )
        table = _table("id", "key", "class", "state")
        for c in f.children:
            table.add_row(str(c.id), c.key or "", c.workflow_type, c.state)
        more = f.children_started - len(f.children)
        title = "children" + (f" (first {len(f.children)}; {more} more)" if more > 0 else "")
        lines += [Text(""), _section(title, table)]
    return lines


def _paused_hint(workflow_id: int) -> str:
    return (
        f"paused: after a fix, `geneva-drive resume {workflow_id}` runs the step again; or "
        f"`skip {workflow_id}`, `resume-at {workflow_id} STEP`, `cancel {workflow_id}`"
    )


def _executions(t: admin.Timeline) -> Group:
    title = "executions" + (" (the newest only)" if t.truncated else "")
    table = _table(
        "ID",
        "STEP",
        "STATE",
        "OUTCOME",
        "#",
        "DUE",
        "STARTED",
        "TOOK",
        "ERROR",
        folding=("STEP", "ERROR"),
    )
    for e in t.executions:
        step = f"{e.step_name} (timer)" if e.is_timer else e.step_name
        if e.iterations is not None:
            step += f" ({e.iterations} iterations)"
        table.add_row(
            str(e.id),
            step,
            e.state,
            e.outcome or "",
            str(e.attempt),
            short(e.scheduled_for),
            short(e.started_at),
            age(e.duration_seconds),
            _error(e),
        )
    return _section(title, table)


def _results(entries: list[admin.ExecutionEntry]) -> Group:
    table = _table("ID", "STEP", "RESULT", folding=("STEP", "RESULT"))
    for e in entries:
        table.add_row(str(e.id), e.step_name, _value(e.result))
    return _section("step results", table)


def _value(value: object) -> str:
    """A stored value (an input, a result) as one line of JSON, cut at VALUE_CHARACTERS."""
    shown = json.dumps(admin.to_json(value), sort_keys=True, ensure_ascii=False)
    return shown if len(shown) <= VALUE_CHARACTERS else shown[: VALUE_CHARACTERS - 1] + "…"


def _error(e: admin.ExecutionEntry) -> str:
    """``Class: message`` (its first line, cut at ERROR_CHARACTERS); the backtrace is below."""
    if not e.error_class:
        return ""
    message = (e.error_message or "").strip().split("\n", 1)[0]
    if len(message) > ERROR_CHARACTERS:
        message = message[: ERROR_CHARACTERS - 1] + "…"
    return f"{e.error_class}: {message}" if message else e.error_class


def _failure(e: admin.ExecutionEntry) -> list[RenderableType]:
    lines: list[RenderableType] = [
        Text(
            f"latest error: execution {e.id}, step {e.step_name!r}, attempt {e.attempt}",
            style="bold",
        ),
        Text(f"{e.error_class}: {e.error_message or ''}"),
    ]
    if e.error_backtrace:
        lines.append(Text(e.error_backtrace.rstrip()))
    return lines


def _signals(signals: tuple[admin.SignalEntry, ...]) -> Group:
    table = _table(
        "ID",
        "NAME",
        "STATE",
        "KEY",
        "PAYLOAD",
        "RECEIVED",
        "CONSUMED BY",
        folding=("NAME", "KEY", "PAYLOAD"),
    )
    for s in signals:
        table.add_row(
            str(s.id),
            s.name,
            s.state,
            s.idempotency_key or "",
            s.payload_preview,
            short(s.created_at),
            "" if s.consumed_by is None else str(s.consumed_by),
        )
    return _section("signals", table)


def _actions(actions: tuple[admin.ActionEntry, ...]) -> Group:
    table = _table("AT", "ACTION", "ACTOR", "REASON", folding=("REASON",))
    for a in actions:
        table.add_row(when(a.at), a.action, a.actor, a.reason or "")
    return _section("operator actions", table)


# -- acting --------------------------------------------------------------------------------


def action_line(result: admin.ActionResult) -> str:
    detail = f": {result.detail}" if result.detail else ""
    return f"{result.action}: workflow {result.workflow_id} ({result.change}){detail}"


def _ids(ids: tuple[int, ...]) -> str:
    shown = ", ".join(str(i) for i in ids[:SHOWN_IDS])
    more = len(ids) - SHOWN_IDS
    return shown + (f" … and {more} more" if more > 0 else "")


def bulk_lines(action: str, result: admin.BulkResult) -> str:
    if not result.matched:
        return "no workflows match"
    verb = f"would {action}" if result.dry_run else action
    lines = [f"{result.matched} workflow(s) match"]
    if result.changed:
        lines.append(f"{verb}: {len(result.changed)} ({_ids(result.changed)})")
    if result.skipped:
        lines.append(f"skipped {result.skipped} finished or canceled (no action applies)")
    if result.refused:
        lines.append(f"{'would refuse' if result.dry_run else 'refused'}: {len(result.refused)}")
        lines += [f"  workflow {id_}: {why}" for id_, why in result.refused[:SHOWN_IDS]]
        if len(result.refused) > SHOWN_IDS:
            lines.append(f"  … and {len(result.refused) - SHOWN_IDS} more")
    return "\n".join(lines)


# -- stats ---------------------------------------------------------------------------------


def stats(s: admin.Stats) -> RenderableType:
    states = sorted({state for _, state, _ in s.by_class_state})
    counts = {(cls, state): n for cls, state, n in s.by_class_state}
    by_class = _table(
        "TYPE",
        *(st.upper() for st in states),
    )
    for cls in sorted({cls for cls, _, _ in s.by_class_state}):
        by_class.add_row(cls, *(str(counts.get((cls, st), "")) for st in states))
    overdue = _table(
        "QUEUE",
        "OVERDUE",
        "OLDEST DUE",
    )
    for backlog in s.overdue:
        overdue.add_row(backlog.queue, str(backlog.count), age(backlog.oldest_due_age_seconds))
    outcomes = _table(
        "TYPE",
        "STEP",
        "OUTCOME",
        "5 MIN",
        "60 MIN",
    )
    for o in s.outcomes:
        outcomes.add_row(o.workflow_type, o.step, o.outcome, str(o.last_5m), str(o.last_60m))
    summary = Text(
        f"at {when(s.at)}: waiting {s.waiting} ({s.overdue_waits} past their deadline), "
        f"expired leases {s.expired_leases}; last hour: finished {s.finished_last_hour}, "
        f"canceled {s.canceled_last_hour}, failed executions {s.failed_last_hour}"
    )
    parts: list[RenderableType] = [
        summary,
        Text(""),
        _section("workflows by state", by_class)
        if s.by_class_state
        else Text("no ongoing workflows"),
    ]
    parts += [
        Text(""),
        _section("overdue scheduled steps", overdue)
        if s.overdue
        else Text("no overdue scheduled steps"),
    ]
    if s.outcomes:
        parts += [Text(""), _section("step outcomes", outcomes)]
    return Group(*parts)


# -- limits --------------------------------------------------------------------------------


def limits(found: admin.Limits) -> RenderableType:
    """Concurrency keys (running, waiting, the oldest holder) and rate keys' recent starts."""
    keys = _table("KEY", "RUNNING", "WAITING", "TYPES", "HOLDERS (EXECUTION IDS)", folding=("KEY",))
    for k in found.concurrency:
        holders = ", ".join(str(h.execution_id) for h in k.holders)
        keys.add_row(k.key, str(k.running), str(k.waiters), ", ".join(k.workflow_types), holders)
    rates = _table("KEY", "STARTS (LAST MINUTE)", "LAST START", folding=("KEY",))
    for r in found.rate:
        rates.add_row(r.key, str(r.starts_last_minute), when(r.last_start))
    return Group(
        Text(f"at {when(found.at)}"),
        Text(""),
        _section("concurrency limits", keys)
        if found.concurrency
        else Text("no concurrency key is held or waited for"),
        Text(""),
        _section("rate limits", rates)
        if found.rate
        else Text("no rate-limited start in the last minute"),
    )


# -- check ---------------------------------------------------------------------------------


def deploy_report(report: Report) -> RenderableType:
    """Lines of text only: ``check`` prints them with ``soft_wrap`` so that a terminal folds a
    long fix itself and a copied command stays one line."""
    parts: list[RenderableType] = []
    for f in report.findings:
        label = "STRANDED" if f.stranded else "gravestone"
        parts.append(Text(f"{label}: {f.message}", style="bold" if f.stranded else ""))
        parts.append(Text(f"  fix: {f.fix}"))
    parts.append(Text(f"deploy check: {report.summary(hint=False)}"))
    return Group(*parts)
