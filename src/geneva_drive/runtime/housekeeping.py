"""Housekeeping: delete old finished workflows, recover lost executions, publish gauges.

Run it periodically — ``geneva-drive housekeeping`` from cron, ``run()`` from your scheduler,
or ``geneva-drive worker --housekeeping-interval 300`` (one worker at a time does it, by a
database lock). Order of work, as in the gem: cleanup → recovery → gauges.

Recovery comes in three kinds, all ending in :func:`recover_execution`:

- **expired leases** — an ``in_progress`` execution whose worker stopped heartbeating (it was
  killed, its machine died). Every worker also sweeps these every few seconds, so housekeeping
  is only the backstop. Always recovered with ``reattempt``: the step simply runs again.
- **stuck in progress** — ``in_progress`` longer than ``stuck_in_progress_threshold`` without
  a live lease (steps run by external backends, which hold no lease).
- **stuck scheduled** — overdue by ``stuck_scheduled_threshold``: a wake-up an external
  backend lost. Skipped by default with the ``DatabaseBackend``, where the row *is* the
  delivery and recovering it would only push a backlog to the back of the queue.

Deltas from the gem: paused workflows are never touched (H-12); a row whose recovery fails
is reported and passed over, never retried in the same run (H-20); waiting-gauge totals are
published as 0 when nothing waits (H-13); the gauges count ongoing workflows and those that
finished or were canceled in the last hour, not every finished row kept (see :func:`gauges`).

Cost: every query of a pass is an index range over the rows it acts on or counts (old
terminal workflows, expired leases, stuck rows, ongoing and recent workflows, waiting
executions), so a pass with nothing to do costs about the same with 10k or 1M rows kept.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from geneva_drive.core import events
from geneva_drive.core.ports import rows_are_the_queue
from geneva_drive.core.settings import Settings, settings
from geneva_drive.core.states import TERMINAL_WORKFLOW_STATES, ExecutionState, WorkflowState
from geneva_drive.engine import limits
from geneva_drive.engine.recovery import sweep
from geneva_drive.storage import queries
from geneva_drive.storage.db import session_factory
from geneva_drive.storage.queries import admin as admin_queries
from geneva_drive.storage.queries import fairness

if TYPE_CHECKING:
    pass

log = logging.getLogger("geneva_drive.housekeeping")

RESULT_KEYS = (
    "workflows_cleaned_up",
    "step_executions_cleaned_up",
    "signals_cleaned_up",
    "expired_leases_recovered",
    "stuck_in_progress_recovered",
    "stuck_scheduled_recovered",
    "recovery_failures",
    "dispatched",
    "limit_waiters_woken",
    "fair_keys_pruned",
)


# -- cleanup ---------------------------------------------------------------------------------


def cleanup(config: Settings, result: dict[str, int]) -> None:
    """Delete finished/canceled workflows older than the retention, children first, in batches.

    Each batch is its own short transaction, so a cleanup of millions of rows never holds
    locks for long and can be interrupted at any point without harm. Each finds its rows
    through the ``(state, transitioned_at)`` index, so a pass with nothing old to delete
    reads a few index pages however much recent history is kept.
    """
    keep = config.delete_completed_workflows_after
    if keep is None:
        log.info("cleanup skipped: delete_completed_workflows_after is None")
        return
    cutoff = config.clock.now() - keep  # fixed once, at the start
    batch = config.housekeeping_batch_size
    factory = session_factory(config)
    passes = (
        ("step_executions_cleaned_up", queries.delete_executions_of_old_workflows),
        ("signals_cleaned_up", queries.delete_signals_of_old_workflows),
        ("workflows_cleaned_up", queries.delete_old_workflows),
    )
    for key, delete_batch in passes:
        while True:
            with factory() as session, session.begin():
                deleted = delete_batch(session, cutoff, batch)
            result[key] += deleted
            if deleted < batch:
                break


# -- fair keys -------------------------------------------------------------------------------


def prune_fair_keys(config: Settings, result: dict[str, int]) -> None:
    """Delete the rows of fairness keys no ongoing workflow has, in batches, and give one
    back to a key an ongoing workflow has without one.

    Every key ever used has a row (``queries.fairness``), and a key's turn walks past the
    keys served longest ago that have nothing due: without this, every tenant that ever ran
    would be looked at by every key's turn. A finished or canceled workflow can schedule
    nothing more, so its key's row can go; a later create() of the key inserts it again.
    Each batch is a short transaction of its own that skips (``SKIP LOCKED``) the rows a claim
    holds. The keys given back are those a create() racing a deletion left without a row
    (see ``fairness.prune_idle_keys``): the first pass after such a create() repairs it.
    """
    factory = session_factory(config)
    with factory() as session, session.begin():
        kept = fairness.every_key(session)
        if not kept and not fairness.any_key_scheduled(session):
            # Fairness unused: no key rows, no keyed step due. Without this the read below
            # would walk every ongoing workflow on every pass, to find no key.
            return
        ongoing = fairness.keys_of_ongoing_workflows(session)
        fairness.register_keys(session, sorted(ongoing.difference(kept)))
        candidates = [key for key in kept if key not in ongoing]
    batch = config.housekeeping_batch_size
    for start in range(0, len(candidates), batch):
        with factory() as session, session.begin():
            pruned = fairness.prune_idle_keys(session, candidates[start : start + batch])
        result["fair_keys_pruned"] += pruned


# -- gauges ----------------------------------------------------------------------------------


# Finished and canceled workflows are gauged over this sliding window only (see gauges()).
RECENT_WINDOW = timedelta(hours=1)
RECENT_SUFFIX = "_last_hour"


def gauges(config: Settings | None = None) -> list[tuple[str, float, dict[str, str]]]:
    """The gauges as (name, value, tags), computed from the database (gem-spec F.5, bounded).

    Every query here is an index range over the rows it counts, so the gauges cost the same
    with 10k or 1M rows of history (``benchmarks/flatcost.py``):

    - ``geneva_drive.<state>`` for the ongoing states (ready, performing, paused): total and
      per ``workflow`` class, for the states present — exact, as in the gem.
    - ``geneva_drive.finished_last_hour`` / ``geneva_drive.canceled_last_hour``: total and per
      class, workflows that *became* finished/canceled within the last hour. The gem's
      ``geneva_drive.finished`` / ``.canceled`` counted every terminal row still kept (up to
      ``delete_completed_workflows_after``): a full scan of the table on every pass, for a
      number that mostly measured the retention. Renamed, not redefined, so a dashboard built
      on the old names shows "no data" instead of a silently different quantity.
    - ``geneva_drive.paused_ratio`` per class: paused ÷ *ongoing* workflows of that class (the
      gem divided by all rows kept, finished ones included, so the ratio of a class with any
      history tended to 0). 0.0 for a class with ongoing workflows and none paused.
    - ``geneva_drive.waiting_step_executions`` and ``geneva_drive.waiting_overdue``: total
      (also when 0, H-13) and per class.
    """
    config = config or settings()
    now = config.clock.now()
    with session_factory(config)() as session, session.begin():
        # The overview's query (admin.stats): the dashboard and the gauges show one count.
        counts = admin_queries.workflow_counts(session, now - RECENT_WINDOW)
        waiting = queries.waiting_counts(session)
        threshold = config.waiting_visibility_threshold
        overdue = (
            queries.waiting_counts(session, now - threshold) if threshold is not None else None
        )
    out: list[tuple[str, float, dict[str, str]]] = []
    per_name: dict[str, int] = {}
    per_class: dict[str, int] = {}  # ongoing workflows, the paused ratio's denominator
    paused: dict[str, int] = {}
    named: list[tuple[str, str, int]] = []
    for type_, state, number in counts:
        count = int(number)
        terminal = state in TERMINAL_WORKFLOW_STATES
        name = f"geneva_drive.{state}{RECENT_SUFFIX if terminal else ''}"
        named.append((name, type_, count))
        per_name[name] = per_name.get(name, 0) + count
        if not terminal:
            per_class[type_] = per_class.get(type_, 0) + count
        if state == WorkflowState.PAUSED:
            paused[type_] = paused.get(type_, 0) + count
    for name, total in sorted(per_name.items()):
        out.append((name, total, {}))
    for name, type_, count in sorted(named):
        out.append((name, count, {"workflow": type_}))
    for type_, total in sorted(per_class.items()):
        out.append(("geneva_drive.paused_ratio", paused.get(type_, 0) / total, {"workflow": type_}))
    # H-13: totals are published even when zero, so a dashboard sees "none" rather than "stale".
    out.append(("geneva_drive.waiting_step_executions", sum(n for _, n in waiting), {}))
    for type_, count in sorted(waiting):
        out.append(("geneva_drive.waiting_step_executions", count, {"workflow": type_}))
    if overdue is not None:
        out.append(("geneva_drive.waiting_overdue", sum(n for _, n in overdue), {}))
        for type_, count in sorted(overdue):
            out.append(("geneva_drive.waiting_overdue", count, {"workflow": type_}))
    return out


def publish_gauges(
    values: list[tuple[str, float, dict[str, str]]], *, registry: Any = None
) -> None:
    """Emit each gauge as a ``gauge`` event, then all as one ``gauges`` event (which sets them
    on every registry ``runtime.metrics.install()`` was given), and, with prometheus-client
    installed, set them on ``registry`` (default: prometheus-client's global one)."""
    for name, value, tags in values:
        events.emit("gauge", {"name": name, "value": value, "tags": dict(tags)})
    events.emit("gauges", {"values": list(values)})
    set_prometheus_gauges(values, registry)


# Our gauges per registry, held weakly by the registry itself: keyed by id() they were handed
# to a new registry created where a collected one had been, and its own stayed empty.
_PROMETHEUS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def set_prometheus_gauges(values: list[tuple[str, float, dict[str, str]]], registry: Any) -> None:
    """Per-class gauges only (``geneva_drive_<name>{workflow=…}``); totals are ``sum()``.

    Every run replaces the previous values, so a class that disappeared stops being reported.
    """
    try:
        import prometheus_client
    except ImportError:
        return
    registry = registry if registry is not None else prometheus_client.REGISTRY
    metrics = _PROMETHEUS.setdefault(registry, {})
    for gauge in metrics.values():
        gauge.clear()  # also the names absent this time: a state nobody is in any more
    for name in {name.replace(".", "_") for name, _, _ in values} - set(metrics):
        metrics[name] = prometheus_client.Gauge(
            name, f"geneva-drive housekeeping gauge {name}", ["workflow"], registry=registry
        )
    for name, value, tags in values:
        if "workflow" in tags:
            metrics[name.replace(".", "_")].labels(workflow=tags["workflow"]).set(value)


# -- the entry point -------------------------------------------------------------------------


def run(
    config: Settings | None = None,
    *,
    recover_scheduled: bool | None = None,
    registry: Any = None,
) -> dict[str, int]:
    """One housekeeping pass; returns the counters (gem-spec F plus the lease/failure deltas).

    ``recover_scheduled``: recover overdue scheduled executions (default: only when the
    configured backend is not the ``DatabaseBackend``). ``registry``: a Prometheus registry
    (default: prometheus-client's global one, if the package is installed).
    """
    config = config or settings()
    result = dict.fromkeys(RESULT_KEYS, 0)
    cleanup(config, result)
    prune_fair_keys(config, result)

    now = config.clock.now()
    leases, failed = sweep(
        config,
        lambda s, after, n: queries.expired_lease_ids(s, now, n, after),
        lambda e: (
            e.state == ExecutionState.IN_PROGRESS
            and e.lease_expires_at is not None
            and e.lease_expires_at < now
        ),
        "reattempt",
        "lease_expired",
    )
    result["expired_leases_recovered"] = leases
    result["recovery_failures"] += failed

    action = config.stuck_recovery_action
    in_progress_cutoff = now - config.stuck_in_progress_threshold
    stuck, failed = sweep(
        config,
        lambda s, after, n: queries.stuck_in_progress_ids(s, in_progress_cutoff, now, n, after),
        lambda e: (
            e.state == ExecutionState.IN_PROGRESS
            and e.started_at is not None
            and e.started_at < in_progress_cutoff
            and (e.lease_expires_at is None or e.lease_expires_at < now)
        ),
        action,
        "stuck_in_progress",
    )
    result["stuck_in_progress_recovered"] = stuck
    result["recovery_failures"] += failed

    # After the recoveries: a recovered holder's slot is freed (and its waiter woken) there.
    with session_factory(config)() as session, session.begin():
        result["limit_waiters_woken"] = limits.wake_stranded(session, now)

    dispatch_due = getattr(config.backend, "dispatch_due", None)
    if dispatch_due is not None:  # e.g. Celery: send long waits coming due, re-send lost ones
        result["dispatched"] = dispatch_due(config)
    if recover_scheduled is None:
        # With the database worker an overdue row is a backlog, and a dispatching backend
        # re-sends lost messages itself: recreating rows would only reorder or duplicate them.
        recover_scheduled = not rows_are_the_queue(config.backend) and (dispatch_due is None)
    if recover_scheduled:
        scheduled_cutoff = now - config.stuck_scheduled_threshold
        stuck, failed = sweep(
            config,
            lambda s, after, n: queries.stuck_scheduled_ids(s, scheduled_cutoff, n, after),
            lambda e: e.state == ExecutionState.SCHEDULED and e.scheduled_for < scheduled_cutoff,
            action,
            "stuck_scheduled",
        )
        result["stuck_scheduled_recovered"] = stuck
        result["recovery_failures"] += failed

    publish_gauges(gauges(config), registry=registry)
    log.info("housekeeping completed: %s", result)
    events.emit("housekeeping", dict(result))
    return result


@contextlib.contextmanager
def exclusive(config: Settings | None = None) -> Iterator[bool]:
    """Yield True if this process holds the cluster-wide housekeeping lock for the block.

    PostgreSQL: ``pg_try_advisory_lock`` on a connection held for the block (released when the
    block ends or the connection dies). SQLite is single-node: always True.
    """
    config = config or settings()
    with config.require_engine().connect() as connection:
        got = queries.try_housekeeping_lock(connection)
        connection.commit()
        try:
            yield got
        finally:
            if got:
                queries.release_housekeeping_lock(connection)
                connection.commit()


def run_exclusive(config: Settings | None = None, **kwargs: Any) -> dict[str, int] | None:
    """:func:`run` unless another process is running housekeeping right now (then None)."""
    with exclusive(config) as got:
        return run(config, **kwargs) if got else None
