"""Child workflows: N children started by one resumable step and fanned in by the next.

    .venv/bin/python benchmarks/fanout.py --children 10000

One parent workflow: ``split``, a resumable step, starts N one-step children with
``start_child``, each with an input, committing every 500 children (``checkpoint_every``);
each child returns its input's number as its result; ``close`` waits for all of them
(``wait_for_children="all"``) and reads their results with ``child_results()``. The
in-process worker (``--concurrency`` step threads) runs the parent and the children until all
N + 1 have finished. Reported:

- ``fan_out_s``: wall time of ``split`` (its executions' first start to last end);
- ``total_s``: wall time from the worker's start to the parent's finish (fan-out, the
  children's steps, the fan-in);
- ``fan_in_lag_ms``: from the last child's end to the ``close`` step's start;
- ``child_results_ms``: ``close``'s ``child_results()`` call (all N results, one query);
- ``statements_per_child`` and ``commits_per_child``: every statement and commit the worker
  sent, divided by N (the progress polls run on an engine of their own);
- ``rows_per_child``: rows in the workflows and executions tables at the end, divided by N
  (a child is its workflow row and one execution; the parent's rows are amortised).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _gd
from _common import emit, log, machine, start_postgres
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from geneva_drive import Workflow, resumable_step, step

CHILDREN = {"n": 10_000}  # set by main() before the parent runs
BATCH = {"n": 500}
READ: dict[str, float] = {}  # close's child_results(): seconds


class BenchFanChild(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> dict[str, int]:
        return {"n": self.input["n"]}


class BenchFanParent(Workflow):
    may_proceed_without_hero = True

    @resumable_step(max_runtime=timedelta(hours=2), checkpoint_every=500)
    def split(self, it) -> None:  # type: ignore[no-untyped-def]
        for n in it.iterate_over(range(CHILDREN["n"])):
            self.start_child(BenchFanChild, key=f"child-{n}", input={"n": n})

    @step(wait_for_children="all")
    def close(self) -> None:
        t0 = time.perf_counter()
        results = self.child_results()
        READ["seconds"] = time.perf_counter() - t0
        expected = CHILDREN["n"]
        if len(results) != expected or sum(r["n"] for r in results.values()) != sum(
            range(expected)
        ):
            raise AssertionError(f"child_results(): {len(results)} results, not {expected}")


def one(url: str, children: int, concurrency: int) -> dict:
    engine, config = _gd.prepare(url)
    CHILDREN["n"] = children
    with Session(engine) as session:
        BenchFanParent.create(session)
        session.commit()
    log(f"fanout: {children} children, concurrency {concurrency}")
    counts = {"statements": 0, "commits": 0}

    def on_statement(*_: object) -> None:
        counts["statements"] += 1

    def on_commit(*_: object) -> None:
        counts["commits"] += 1

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "commit", on_commit)
    run = _gd.run_in_process(config, children + 1, concurrency, timeout=3600)
    event.remove(engine, "before_cursor_execute", on_statement)
    event.remove(engine, "commit", on_commit)
    with engine.connect() as conn:
        workflows = conn.execute(text("SELECT count(*) FROM geneva_drive_workflows")).scalar_one()
        executions = conn.execute(
            text("SELECT count(*) FROM geneva_drive_step_executions")
        ).scalar_one()
        split = conn.execute(
            text(
                "SELECT min(started_at), max(finished_at) FROM geneva_drive_step_executions "
                "WHERE step_name = 'split'"
            )
        ).one()
        last_child = conn.execute(
            text(
                "SELECT max(finished_at) FROM geneva_drive_step_executions WHERE step_name = 'work'"
            )
        ).scalar_one()
        close = conn.execute(
            text(
                "SELECT max(started_at) FROM geneva_drive_step_executions WHERE step_name = 'close'"
            )
        ).scalar_one()
        counters = conn.execute(
            text(
                "SELECT children_started, children_ended, children_failed "
                "FROM geneva_drive_workflows WHERE parent_id IS NULL"
            )
        ).one()
    engine.dispose()
    return {
        "bench": "fanout",
        "backend": engine.dialect.name,
        "children": children,
        "concurrency": concurrency,
        "fan_out_s": round(_gd._seconds(split[1], split[0]), 2),
        "total_s": round(run.seconds, 2),
        "fan_in_lag_ms": round(_gd._seconds(close, last_child) * 1000, 1),
        "child_results_ms": round(READ.get("seconds", float("nan")) * 1000, 1),
        "statements_per_child": round(counts["statements"] / children, 2),
        "commits_per_child": round(counts["commits"] / children, 3),
        "rows_per_child": round((workflows + executions) / children, 3),
        "counters": list(counters),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    server = start_postgres(args.durability) if args.backend == "postgresql" else None
    results = []
    try:
        emit(bench="machine", **machine())
        for _ in range(args.runs):
            if server is not None:
                name, url = server.create_database("fan")
            else:
                url = _gd.sqlite_url(Path(tempfile.mkdtemp(prefix="gd-bench-sqlite-")))
            t0 = time.perf_counter()
            concurrency = 1 if args.backend == "sqlite" else args.concurrency
            result = one(url, args.children, concurrency)
            result["wall_s"] = round(time.perf_counter() - t0, 1)
            emit(**result)
            results.append(result)
            if server is not None:
                server.drop_database(name)
    finally:
        if server is not None:
            server.stop()
    return results


if __name__ == "__main__":
    main()
