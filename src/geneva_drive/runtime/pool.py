"""How many connections a worker needs, and whether an engine's pool has them.

A worker holds one connection per step thread (a step keeps its connection from claim to
hand-back), one for its maintenance thread (the heartbeat, lease recovery and housekeeping,
one after another), and checks one out for LISTEN and for its own start and stop. A pool with
fewer makes threads queue for a connection — and a heartbeat that waits out the pool's timeout
(30 s by default) is a lease that expires under a running step, which another worker then
recovers and runs a second time.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.pool import QueuePool

# The maintenance thread's reserved connection, and one for the worker's own start and stop
# (the deploy check, releasing leases); LISTEN's is counted apart, where there is one.
OVERHEAD = 2


def connections_needed(concurrency: int, *, listen: bool) -> int:
    """The connections a worker with ``concurrency`` step threads may hold at once."""
    return concurrency + OVERHEAD + (1 if listen else 0)


def pool_capacity(engine: Engine) -> int | None:
    """How many connections ``engine``'s pool hands out at most (None: no fixed limit)."""
    pool = engine.pool
    if not isinstance(pool, QueuePool):  # NullPool, StaticPool, SingletonThreadPool, …
        return None
    # QueuePool has no public accessor for its overflow limit; -1 means unlimited.
    overflow = int(getattr(pool, "_max_overflow", 0))
    return None if overflow < 0 else pool.size() + overflow


def pool_problem(engine: Engine, concurrency: int, *, listen: bool) -> str | None:
    """Why ``engine``'s pool is too small for a worker of ``concurrency`` threads, or None."""
    capacity = pool_capacity(engine)
    needed = connections_needed(concurrency, listen=listen)
    if capacity is None or capacity >= needed:
        return None
    uses = f"{concurrency} step thread(s), one for the heartbeat, one for start-up and stop"
    if listen:
        uses += ", one for LISTEN"
    return (
        f"the engine's pool hands out at most {capacity} connection(s) (pool_size + "
        f"max_overflow) and a worker with concurrency={concurrency} needs {needed} ({uses}); "
        f"create the engine with geneva_drive.create_engine(url, pool_size={needed}) or lower "
        "the concurrency — a heartbeat that waits for a connection lets its leases expire "
        "under running steps"
    )
