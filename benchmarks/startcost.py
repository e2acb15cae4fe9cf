"""Start cost: what ``create()`` (and a bulk start) costs the caller's transaction.

    .venv/bin/python benchmarks/startcost.py --samples 500
    .venv/bin/python benchmarks/startcost.py --samples 500 --profile 20     # + cProfile top 20
    .venv/bin/python benchmarks/startcost.py --backend sqlite

Modes, each on a fresh database (no worker runs; the rows stay scheduled):

- ``trivial``: one transaction inserting one row of a small table and committing — the floor
  of any transaction on this engine;
- ``create``: one transaction per ``BenchThreeSteps.create(session)`` + commit (a web request
  starting one workflow);
- ``create_in_one``: ``--batch`` creates in one transaction (a loop in a backfill);
- ``create_many``: ``Workflow.create_many`` of ``--bulk`` workflows in one transaction;
- ``signal``: one transaction per ``session.get()`` + ``workflow.signal("go")`` + commit, on
  workflows parked on that signal (prepared before the clock starts): a web request
  delivering an event; ``get``: the same without the signal, what ``signal()`` adds to.
  Its ``signal_split``: the CPU inside ``signal()`` itself, and the part of it spent
  sending its two statements in psycopg's pipeline and reading the answers — the floor
  of any delivery that takes the row lock as a statement of its own.

For each: wall ms and caller CPU ms per workflow (process CPU of this script, which is all
the caller: no worker runs), and — in a second, observed pass, since a statement listener
turns off the DBAPI short path — statements, commits and pooled-connection checkouts per
workflow, by kind. The commits counted are every commit the engine sends, the wake-up's own
included. PostgreSQL by default ``synchronous_commit=on`` over TCP (``--durability``,
``--transport``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
import gd_app
from _common import emit, log, machine, start_postgres
from sqlalchemy import Column, Integer, MetaData, String, Table, event, insert
from sqlalchemy.orm import Session

_META = MetaData()
TRIVIAL = Table(
    "bench_trivial", _META, Column("id", Integer, primary_key=True), Column("note", String(40))
)


def _trivial(session: Session, count: int) -> None:
    for _ in range(count):
        session.execute(insert(TRIVIAL).values(note="x"))
        session.commit()


def _create(session: Session, count: int) -> None:
    for _ in range(count):
        gd_app.BenchThreeSteps.create(session)
        session.commit()


def _create_in_one(batch: int) -> Callable[[Session, int], None]:
    def run(session: Session, count: int) -> None:
        made = 0
        while made < count:
            for _ in range(min(batch, count - made)):
                gd_app.BenchThreeSteps.create(session)
            session.commit()
            made += batch

    return run


def _create_many(bulk: int) -> Callable[[Session, int], None]:
    def run(session: Session, count: int) -> None:
        made = 0
        while made < count:
            n = min(bulk, count - made)
            gd_app.BenchThreeSteps.create_many(session, count=n)
            session.commit()
            made += n

    return run


class _Signal:
    """``signal()`` + commit, one transaction each, on workflows parked waiting for it.

    As a web request does it: the workflow loaded by id (one SELECT), signalled, committed.
    Only ids are kept between transactions, so the session holds just that one workflow.
    """

    def prepare(self, session: Session, count: int) -> None:
        from geneva_drive.testing import perform_next_step

        workflows = [gd_app.BenchSignaled.create(session) for _ in range(count)]
        session.commit()
        for workflow in workflows:
            perform_next_step(workflow)  # "first"
            perform_next_step(workflow)  # "woken" finds no signal and parks
        self.parked = [workflow.id for workflow in workflows]
        session.expunge_all()

    def __init__(self, deliver: bool = True) -> None:
        self.parked: list[int] = []
        self.deliver = deliver  # False: the same load and commit without the signal
        # CPU seconds of the last pass: in signal() itself, and in the part of it that sends
        # its two statements through psycopg's pipeline and reads their answers.
        self.in_signal = self.in_statements = 0.0

    def __call__(self, session: Session, count: int) -> None:
        from geneva_drive.storage.queries import bypass

        self.in_signal = self.in_statements = 0.0
        pipelined = bypass.execute_pipelined

        def timed(*args: Any) -> Any:
            started = time.process_time()
            try:
                return pipelined(*args)
            finally:
                self.in_statements += time.process_time() - started

        bypass.execute_pipelined = timed  # looked up at each call, from bypass's own globals
        try:
            for workflow_id in self.parked[:count]:
                workflow = session.get(gd_app.BenchSignaled, workflow_id)
                assert workflow is not None
                if self.deliver:
                    started = time.process_time()
                    workflow.signal("go")
                    self.in_signal += time.process_time() - started
                session.commit()
        finally:
            bypass.execute_pipelined = pipelined


def _prepare(run: Callable, session: Session, count: int) -> None:  # type: ignore[type-arg]
    """What a mode sets up before each pass, outside the clock (the signal modes' parked
    workflows)."""
    if hasattr(run, "prepare"):
        run.prepare(session, count)


def _timed(run: Callable, session: Session, count: int) -> tuple[float, float]:  # type: ignore[type-arg]
    """Wall and CPU seconds of ``run`` (its unmeasured ``prepare`` first, if it has one)."""
    _prepare(run, session, count)
    cpu0, t0 = _cpu(), time.perf_counter()
    run(session, count)
    return time.perf_counter() - t0, _cpu() - cpu0


@contextmanager
def counting(engine: Any) -> Iterator[Counter[str]]:
    """Statements by first word, commits, and connection checkouts sent while inside."""
    seen: Counter[str] = Counter()

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = statement.lstrip().split()
        first = words[0].upper()
        if first == "SELECT" and "pg_notify" in statement:
            first = "SELECT pg_notify"
        seen[first] += 1

    def on_commit(conn: Any) -> None:
        seen["COMMIT"] += 1

    def on_checkout(*_: Any) -> None:
        seen["checkout"] += 1

    event.listen(engine, "before_cursor_execute", on_execute)
    event.listen(engine, "commit", on_commit)
    event.listen(engine.pool, "checkout", on_checkout)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
        event.remove(engine, "commit", on_commit)
        event.remove(engine.pool, "checkout", on_checkout)


def _cpu() -> float:
    return time.process_time()


def one_mode(args: argparse.Namespace, server: Any, name: str, run: Callable) -> dict:  # type: ignore[type-arg]
    tmp = None
    if server is not None:
        db, url = server.create_database("start")
        url = server.url(db)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="gd-bench-start-"))
        url, db = _gd.sqlite_url(tmp), None
    engine, _config = _gd.prepare(url)
    _META.create_all(engine)
    samples = args.samples
    with Session(engine) as session:
        _timed(run, session, min(50, samples))  # warm-up: caches, prepared statements, pool
        wall, cpu = _timed(run, session, samples)
        split = None
        if isinstance(run, _Signal) and run.deliver:
            split = {
                "signal_call_cpu_ms": round(run.in_signal * 1000 / samples, 3),
                "its_two_statements_cpu_ms": round(run.in_statements * 1000 / samples, 3),
            }
        profile_text = None
        if args.profile:
            _prepare(run, session, samples)
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            run(session, samples)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.profile)
            profile_text = out.getvalue()
        _prepare(run, session, samples)
        with counting(engine) as seen:
            run(session, samples)
    engine.dispose()
    if server is not None and db is not None:
        server.drop_database(db)
    result = {
        "bench": "startcost",
        "mode": name,
        "backend": args.backend,
        "durability": args.durability if server else None,
        "transport": server.transport if server else None,
        "samples": samples,
        "wall_ms_per_workflow": round(wall * 1000 / samples, 3),
        "cpu_ms_per_workflow": round(cpu * 1000 / samples, 3),
        "workflows_per_s": round(samples / wall, 1),
        "per_workflow": {k: round(v / samples, 3) for k, v in sorted(seen.items())},
    }
    if split is not None:
        result["signal_split"] = split
    if profile_text:
        log(f"--- cProfile, {name} ---\n{profile_text}")
    return result


def main(argv: list[str] | None = None) -> list[dict]:  # type: ignore[type-arg]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--batch", type=int, default=500, help="creates per transaction")
    parser.add_argument("--bulk", type=int, default=10000, help="create_many size")
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    parser.add_argument("--modes", default="trivial,create,create_in_one,create_many,get,signal")
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N")
    parser.add_argument("--sort", default="tottime", help="cProfile's order (e.g. cumulative)")
    args = parser.parse_args(argv)
    runs = {
        "trivial": _trivial,
        "create": _create,
        "create_in_one": _create_in_one(args.batch),
        "create_many": _create_many(args.bulk),
        "signal": _Signal(),
        "get": _Signal(deliver=False),
    }
    wanted = [m for m in args.modes.split(",") if m]
    server = (
        start_postgres(args.durability, transport=args.transport)
        if args.backend == "postgresql"
        else None
    )
    results = []
    try:
        emit(bench="machine", **machine())
        for mode in wanted:
            if mode == "create_many" and not hasattr(gd_app.BenchThreeSteps, "create_many"):
                continue
            log(f"startcost: {mode}")
            samples = args.samples
            if mode == "create_many":
                args.samples = max(samples, args.bulk)
            result = one_mode(args, server, mode, runs[mode])
            args.samples = samples
            emit(**result)
            results.append(result)
    finally:
        if server is not None:
            server.stop()
    return results


if __name__ == "__main__":
    main()
