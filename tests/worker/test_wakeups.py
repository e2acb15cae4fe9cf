"""Wake-ups reach one idle step thread at a time, and none is lost (worker.IdleThreads)."""

from __future__ import annotations

import threading
from datetime import datetime

from sqlalchemy.orm import Session

from geneva_drive import DatabaseBackend, Workflow, step
from geneva_drive.runtime.configure import configured
from geneva_drive.runtime.worker import IdleThreads, Worker
from tests.worker._support import DEADLINE, finished, wait_until_true

FOREVER = 600.0  # a sleep the tests never wait out: only a wake-up ends it in time


class WakeupsOneStep(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        pass


class _Sleepers:
    """Threads sleeping in one IdleThreads; records who came back, in order."""

    def __init__(self, idle: IdleThreads) -> None:
        self.idle = idle
        self.returned: list[str] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, name: str, due: datetime | None = None) -> None:
        before = self.idle.idle

        def sleep() -> None:
            self.idle.sleep(FOREVER, due)
            with self._lock:
                self.returned.append(name)

        thread = threading.Thread(target=sleep, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        # One at a time, so the order they went idle in is known.
        wait_until_true(lambda: self.idle.idle == before + 1, f"{name} to go idle")

    def wait_returned(self, count: int) -> list[str]:
        wait_until_true(lambda: len(self.returned) >= count, f"{count} thread(s) to wake")
        with self._lock:
            return list(self.returned)

    def close(self) -> None:
        self.idle.close()
        for thread in self.threads:
            thread.join(DEADLINE)


# -- IdleThreads on its own ------------------------------------------------------------------


def test_one_wakeup_wakes_one_idle_thread_the_most_recently_idle():
    sleepers = _Sleepers(IdleThreads(3))
    try:
        for name in ("a", "b", "c"):
            sleepers.start(name)

        sleepers.idle.set()

        assert sleepers.wait_returned(1) == ["c"]
        assert sleepers.idle.idle == 2  # the others sleep on: one wake-up, one claim
        sleepers.idle.set()
        assert sleepers.wait_returned(2) == ["c", "b"]
    finally:
        sleepers.close()
    assert sorted(sleepers.returned) == ["a", "b", "c"]  # close() wakes everyone


def test_a_wakeup_with_no_thread_idle_makes_the_next_one_claim_instead_of_sleeping():
    idle = IdleThreads(2)
    idle.set()  # every thread busy (claiming, or between its empty claim and its sleep)

    assert idle.sleep(FOREVER, None) is True  # returns at once: look again
    assert idle.take_missed() is False  # counted once


def test_missed_wakeups_are_capped_at_one_per_thread():
    idle = IdleThreads(2)
    for _ in range(5):
        idle.set()

    assert [idle.take_missed() for _ in range(3)] == [True, True, False]


def test_a_wakeup_spares_the_thread_timing_a_due_row_for_the_others():
    due = datetime(2030, 1, 1, 12, 0)
    sleepers = _Sleepers(IdleThreads(3))
    try:
        sleepers.start("timer", due)  # first to sleep until `due`: it wakes for that row
        sleepers.start("second", due)  # same row: wakes a little after the timer
        sleepers.start("poller")  # no due row known

        sleepers.idle.set()
        assert sleepers.wait_returned(1) == ["poller"]
        sleepers.idle.set()
        assert sleepers.wait_returned(2) == ["poller", "second"]
        sleepers.idle.set()  # only the timer left: it goes
        assert sleepers.wait_returned(3) == ["poller", "second", "timer"]
    finally:
        sleepers.close()


def test_a_relayed_wakeup_is_passed_on_to_the_next_idle_thread_by_the_one_it_woke():
    sleepers = _Sleepers(IdleThreads(3))
    woken_as_relay: list[bool] = []

    def sleep_then_report() -> None:
        sleepers.idle.sleep(FOREVER, None)
        woken_as_relay.append(sleepers.idle.woken_as_relay())

    try:
        sleepers.start("a")
        sleepers.start("b")
        reporter = threading.Thread(target=sleep_then_report, daemon=True)
        reporter.start()
        wait_until_true(lambda: sleepers.idle.idle == 3, "the reporter to go idle")

        sleepers.idle.set(relay=True)  # a NOTIFY: wakes the most recently idle, as a relay
        reporter.join(DEADLINE)
        assert woken_as_relay == [True]
        assert sleepers.idle.idle == 2
        sleepers.idle.pass_on()  # it claimed a row: the next idle thread claims too
        assert sleepers.wait_returned(1) == ["b"]
    finally:
        sleepers.close()


def test_an_in_process_wakeup_is_not_a_relay_and_passing_on_with_none_idle_counts_nothing():
    idle = IdleThreads(2)
    idle.pass_on()  # nobody idle: every thread is busy and claims again after its step
    assert idle.take_missed() is False

    idle.set()  # no thread idle: counted as missed, so the next sleep returns at once
    assert idle.sleep(FOREVER, None) is True
    assert idle.woken_as_relay() is False


def test_after_close_no_thread_sleeps():
    idle = IdleThreads(1)
    idle.close()

    assert idle.sleep(FOREVER, None) is True
    assert idle.take_missed() is True
    idle.set()  # ignored once closed
    assert idle.idle == 0


# -- in the worker ---------------------------------------------------------------------------


def _run(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return thread


def test_a_commit_wakes_one_of_the_idle_step_threads(gd, session):
    # listen=False: the in-process wake-up only (on PostgreSQL the worker's own NOTIFY would
    # wake a second thread, which is right for a row committed by another process).
    worker = Worker(config=gd, concurrency=4, poll_interval=FOREVER, listen=False)
    thread = _run(worker)
    try:
        wait_until_true(lambda: worker._wakeup.idle == 4, "all four step threads to go idle")
        before = worker.idle_waits

        wf = WakeupsOneStep.create(session)
        session.commit()

        wait_until_true(finished(gd, wf.id), "the workflow to finish")
        wait_until_true(lambda: worker._wakeup.idle == 4, "the step threads to go idle again")
        # One thread woke, ran the step, found nothing more and went back to sleep; the other
        # three never woke (a shared Event woke all four: four claims for one row).
        assert worker.idle_waits == before + 1
        assert worker.steps_run == 1
    finally:
        worker.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive()


class WakeupsHeldStep(Workflow):
    """Its step holds its thread until released, counting how many threads hold one."""

    may_proceed_without_hero = True
    running = 0
    changed = threading.Condition()
    release = threading.Event()

    @step
    def only(self) -> None:
        cls = WakeupsHeldStep
        with cls.changed:
            cls.running += 1
            cls.changed.notify_all()
        assert cls.release.wait(DEADLINE), "the test never released the held steps"


def test_a_bulk_start_from_another_process_wakes_every_idle_thread_it_needs(
    gd, session, db_backend
):
    threads = 4
    worker = Worker(config=gd, concurrency=threads, poll_interval=FOREVER)
    if db_backend != "postgresql":
        assert worker.listen is False  # no NOTIFY here: another process's starts are polled
        return
    WakeupsHeldStep.running = 0
    WakeupsHeldStep.release = threading.Event()
    thread = _run(worker)
    try:
        wait_until_true(lambda: worker.listening, "the worker to LISTEN")
        wait_until_true(lambda: worker._wakeup.idle == threads, "every step thread to go idle")
        with configured(backend=DatabaseBackend()):  # not the worker's: its NOTIFY only
            WakeupsHeldStep.create_many(session, count=threads + 2)
            session.commit()

        # One NOTIFY for the whole transaction. Each thread that claims passes it on, so all
        # four hold a step long before the ten-minute poll interval would have woken them.
        with WakeupsHeldStep.changed:
            all_running = WakeupsHeldStep.changed.wait_for(
                lambda: WakeupsHeldStep.running == threads, timeout=DEADLINE
            )
        assert all_running, f"only {WakeupsHeldStep.running} of {threads} threads started"
    finally:
        WakeupsHeldStep.release.set()
        worker.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive()


class _CountsIdleQueries(Worker):
    """Counts the idle-time queries (the next due time) its step threads make."""

    idle_queries = 0
    _counting = threading.Lock()

    def _next_wake(self) -> tuple[float, datetime | None]:
        with self._counting:
            self.idle_queries += 1
        return super()._next_wake()


def test_the_thread_a_relayed_notify_reaches_last_goes_back_to_sleep_without_a_query(
    gd, session, db_backend
):
    worker = _CountsIdleQueries(config=gd, concurrency=2, poll_interval=FOREVER)
    if db_backend != "postgresql":
        assert worker.listen is False
        return
    thread = _run(worker)
    try:
        wait_until_true(lambda: worker.listening, "the worker to LISTEN")
        wait_until_true(lambda: worker._wakeup.idle == 2, "both step threads to go idle")
        queries_before, waits_before = worker.idle_queries, worker.idle_waits
        with configured(backend=DatabaseBackend()):  # not the worker's: its NOTIFY only
            wf = WakeupsOneStep.create(session)
            session.commit()

        wait_until_true(finished(gd, wf.id), "the workflow to finish")
        wait_until_true(lambda: worker.idle_waits == waits_before + 2, "both to sleep again")
        # The NOTIFY woke one thread, which claimed the row and passed the wake-up on; the
        # second found nothing and slept on as before. Only the first asked for the next due
        # time (after its step): one empty claim per NOTIFY, not a claim and a query.
        assert worker.idle_queries == queries_before + 1
        assert worker.steps_run == 1
    finally:
        worker.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive()


class _CommitsWhileGoingIdle(Worker):
    """A worker whose only thread sees a row committed between its empty claim and its sleep.

    The commit happens on another thread (an application's), during the idle-time query —
    exactly the window in which a wake-up finds no thread asleep.
    """

    workflow_id: int | None = None

    def _next_wake(self) -> tuple[float, datetime | None]:
        if self.workflow_id is None:

            def commit() -> None:
                with Session(self.config.require_engine()) as app_session:
                    wf = WakeupsOneStep.create(app_session)
                    app_session.commit()
                    self.workflow_id = wf.id

            app = threading.Thread(target=commit)
            app.start()
            app.join(DEADLINE)
        return super()._next_wake()


def test_a_wakeup_between_an_empty_claim_and_the_sleep_is_not_lost(gd):
    worker = _CommitsWhileGoingIdle(config=gd, concurrency=1, poll_interval=FOREVER, listen=False)
    thread = _run(worker)
    try:
        wait_until_true(lambda: worker.workflow_id is not None, "the application's commit")
        workflow_id = worker.workflow_id
        assert workflow_id is not None
        # Without the missed wake-up the thread would sleep the whole poll interval.
        wait_until_true(finished(gd, workflow_id), "the committed workflow to run")
        assert worker.steps_run == 1
    finally:
        worker.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive()


# -- the worker process --------------------------------------------------------------------


def test_freezing_startup_objects_exempts_them_from_full_collections():
    import gc

    from geneva_drive.runtime.worker import freeze_startup_objects

    try:
        freeze_startup_objects()
        # Everything alive now (this test run's modules included) is out of gen-2's walk.
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
