"""The dashboard in a real browser (headless Chromium through Playwright), against a real
worker and database: an operator's morning, each effect checked in the database.

Debian's ``chromium`` is used (``GD_CHROMIUM`` names another binary); Playwright never
downloads a browser. Without one the tests skip, loudly; under CI=true they fail instead.
Screenshots of every page land in tests/dashboard/artifacts/ (not committed).
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from geneva_drive import Workflow
from geneva_drive.dashboard import create_app
from geneva_drive.runtime.worker import Worker
from geneva_drive.storage.db import session_factory
from geneva_drive.testing import perform_next_step
from tests.conftest import _in_ci
from tests.dashboard.apps import DashApproval, Scenario
from tests.dashboard.conftest import allow_everything
from tests.support.app import Order

ARTIFACTS = Path(__file__).parent / "artifacts"
DEADLINE = 60.0


# Module scope, not session: Playwright's sync API leaves its event loop running in this
# thread until it is stopped, and geneva-drive refuses to run an async step from a thread
# whose loop is running — every later test that runs one synchronously would fail.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    executable = os.environ.get("GD_CHROMIUM") or shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright

        driver = sync_playwright().start()
    except Exception as error:
        _no_browser(f"Playwright did not start: {error}")
    try:
        if executable is None:
            raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
        browser = driver.chromium.launch(executable_path=executable, headless=True)
    except Exception as error:
        driver.stop()
        _no_browser(f"headless Chromium ({executable}) did not start: {error}")
    yield browser
    browser.close()
    driver.stop()


def _no_browser(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true and the browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(f"BROWSER TESTS SKIPPED: {reason}")


@pytest.fixture
def serve() -> Iterator[Callable[[Any], str]]:
    """``serve(app)`` runs it with uvicorn on a free loopback port; returns its base URL."""
    import uvicorn

    servers: list[tuple[Any, threading.Thread]] = []

    def start(app: Any) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((server, thread))
        wait_until(lambda: server.started, "the dashboard server to start")
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def worker(gd: Any) -> Iterator[Callable[[], None]]:
    """``start()`` runs a real database worker in a thread until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start() -> None:
        running = Worker(config=gd, concurrency=1, poll_interval=0.05)
        thread = threading.Thread(
            target=running.run, kwargs={"until": stop.is_set, "install_signals": False}
        )
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not stop"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)  # polling a condition with a deadline


def state_in_db(gd: Any, workflow_id: int) -> str:
    with session_factory(gd)() as s:
        return str(s.execute(select(Workflow.state).where(Workflow.id == workflow_id)).scalar())


def serve_dashboard(serve: Callable[[Any], str], gd: Any, *, refresh_seconds: float) -> str:
    """The dashboard on the test's database and clock, open to everyone, acting as
    "browser-test"; its base URL."""
    app = create_app(
        engine=gd.engine,
        authorize=allow_everything,
        actor=lambda request: "browser-test",
        clock=gd.clock,
        refresh_seconds=refresh_seconds,
    )
    return serve(app)


def shoot(page: Any, db_backend: str, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{db_backend}-{name}.png"), full_page=True)


def not_pwned(page: Any) -> None:
    assert page.evaluate("window.__pwned") is None, f"a stored script ran on {page.url}"


def test_an_operator_finds_a_failed_workflow_resumes_it_and_bulk_cancels_the_waiting_ones(
    chromium, serve, worker, gd, session, scenario: Scenario, db_backend
):
    from playwright.sync_api import expect

    # Playwright's default of 5 s per expectation is a wait on a condition, not a sleep; a
    # loaded CI host (a worker thread holding SQLite's write lock, Chromium starting) can need
    # more, and a generous bound costs nothing when the page is quick.
    expect.set_options(timeout=20_000)
    more = [DashApproval.create(session, hero=Order(status="new")) for _ in range(3)]
    session.commit()
    for wf in more:
        perform_next_step(wf)
    base = serve_dashboard(serve, gd, refresh_seconds=0.3)
    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    # The overview: counts per class, the last hour.
    page.goto(base + "/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator('[data-stat="waiting"]')).to_have_text("5")
    not_pwned(page)
    shoot(page, db_backend, "overview")

    # Filter down to the paused workflows, from the list page's form.
    page.click("text=Workflows")
    page.click("summary:has-text('More filters')")
    page.check("input[name=state][value=paused]")
    page.click("button:has-text('Apply filters')")
    rows = page.locator("tr[data-workflow-id]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-workflow-id", str(scenario.failed))
    not_pwned(page)
    shoot(page, db_backend, "workflows")

    # Open it and read the backtrace, collapsed until asked for.
    rows.first.locator("a").first.click()
    backtrace = page.locator("[data-backtrace]").first
    expect(backtrace).to_be_hidden()
    page.click("summary:has-text('Backtrace')")
    expect(backtrace).to_be_visible()
    expect(backtrace).to_contain_text("CardDeclined")
    expect(page.locator(".error-line").first).to_contain_text("<script>window.__pwned = 1")
    not_pwned(page)
    shoot(page, db_backend, "workflow-failed")

    # Deploy the fix, then resume from the keyboard alone, with a reason.
    session.execute(update(Order).where(Order.status == "broken").values(status="ok"))
    session.commit()
    page.evaluate("window.__stayed = true")  # gone if the page reloads instead of refreshing
    resume = page.locator("summary:has-text('Resume…')")
    resume.focus()
    page.keyboard.press("Enter")
    reason = page.locator("form:has(input[value=resume]) input[name=reason]")
    reason.focus()
    page.keyboard.type("card gateway fixed")
    page.keyboard.press("Enter")
    expect(page.locator(".flash")).to_contain_text("resume: paused → ready")
    assert state_in_db(gd, scenario.failed) == "ready"
    expect(page.locator("[data-actor]").last).to_have_text("browser-test")
    expect(page.locator("[data-reason]").last).to_contain_text("card gateway fixed")

    # The worker finishes it; the open page follows without a reload.
    page.evaluate("window.__stayed = true")
    worker()
    wait_until(lambda: state_in_db(gd, scenario.failed) == "finished", "the resumed workflow")
    expect(page.locator("h1 [data-state]")).to_have_text("finished", timeout=DEADLINE * 1000)
    assert page.evaluate("window.__stayed") is True
    shoot(page, db_backend, "workflow-finished")

    # A waiting workflow with a <script> in a signal payload: shown, never run.
    page.goto(f"{base}/workflows/{scenario.waiting}")
    expect(page.locator("[data-payload]").first).to_contain_text("<script>")
    not_pwned(page)
    shoot(page, db_backend, "workflow-waiting")
    page.goto(f"{base}/waiting")
    expect(page.locator("tr[data-workflow-id]")).to_have_count(5)
    not_pwned(page)
    shoot(page, db_backend, "waiting")

    # Bulk-cancel every waiting approval, after the dry run lists them.
    page.goto(f"{base}/workflows?type=DashApproval&state=ready")
    expect(page.locator("[data-count]")).to_contain_text("4 matching")
    page.click("summary:has-text('Act on all 4 matching')")
    expect(page.locator("button:has-text('Resume all 4')")).to_have_count(0)  # none is paused
    page.click("button:has-text('Cancel all 4…')")
    expect(page.locator("[data-dry-run]")).to_contain_text("would cancel: 4")
    expect(page.locator("[data-would-change] a")).to_have_count(4)
    assert state_in_db(gd, scenario.waiting) == "ready"  # a dry run: nothing changed yet
    shoot(page, db_backend, "bulk-dry-run")
    page.fill("input[name=reason]", "campaign over")
    page.click("button:has-text('Yes, cancel 4 workflows')")
    expect(page.locator(".flash")).to_contain_text("4 of 4 matching changed")
    approvals = [scenario.waiting, *(wf.id for wf in more)]
    assert {state_in_db(gd, i) for i in approvals} == {"canceled"}
    assert state_in_db(gd, scenario.scripted_hero) == "ready"  # not matched, not touched

    # Narrow screens: nothing wider than the viewport.
    page.set_viewport_size({"width": 360, "height": 800})
    page.goto(f"{base}/workflows/{scenario.failed}")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    shoot(page, db_backend, "workflow-narrow")
    assert errors == []
    page.close()


def test_keyboard_focus_stays_on_the_same_control_across_live_refreshes(
    chromium, serve, gd, scenario: Scenario
):
    """A refresh swaps #live's children. Without putting focus back, a keyboard user on
    "Resume…" (or on a link) lands on <body> at the next refresh and Enter does nothing: the
    flake CI once showed in the operator test above, and what a screen-reader user would hit."""
    from playwright.sync_api import expect

    base = serve_dashboard(serve, gd, refresh_seconds=0.1)
    page = chromium.new_page()
    page.goto(f"{base}/workflows/{scenario.failed}")
    page.evaluate(
        "window.__refreshes = 0;"
        "document.addEventListener('gd:refreshed', () => { window.__refreshes += 1; })"
    )

    def after_two_refreshes() -> None:
        # page.wait_for_function would evaluate a string, which the dashboard's CSP forbids.
        seen = page.evaluate("window.__refreshes")
        wait_until(lambda: page.evaluate("window.__refreshes") >= seen + 2, "two refreshes")

    page.locator("summary:has-text('Resume…')").focus()
    after_two_refreshes()
    assert page.evaluate("document.activeElement.textContent.trim()") == "Resume…"
    page.keyboard.press("Enter")
    expect(page.locator("details:has(input[value=resume])")).to_have_attribute("open", "")

    # A link without an id: found again by its target and text.
    page.keyboard.press("Escape")
    page.locator("details:has(input[value=resume]) > summary").click()  # closes it again
    hero = page.locator("main a[href*='hero_type=Order']").first
    hero.focus()
    href = hero.get_attribute("href")
    after_two_refreshes()
    assert page.evaluate("document.activeElement.getAttribute('href')") == href

    # The focused action goes away (the workflow is canceled elsewhere): focus moves to the
    # heading that says so, not to <body>.
    page.locator("summary:has-text('Resume…')").focus()
    with session_factory(gd)() as s:
        s.get(Workflow, scenario.failed).cancel()
        s.commit()
    wait_until(
        lambda: (
            page.evaluate("document.querySelector('h1 [data-state]').textContent") == "canceled"
        ),
        "the page to show the cancel",
    )
    assert page.evaluate("document.activeElement.tagName") == "H1"
    page.close()


def within_viewport(page: Any, locator: Any) -> bool:
    box = locator.bounding_box()
    width = page.viewport_size["width"]
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 1


def test_at_390_px_the_workflows_table_shows_each_row_whole_and_its_actions_stay_reachable(
    chromium, serve, gd, scenario: Scenario, db_backend
):
    """A phone in portrait: no sideways scrolling of the page, and none hidden in the table's
    own box either — each workflow's id, class, state, step and error are on screen."""
    from playwright.sync_api import expect

    base = serve_dashboard(serve, gd, refresh_seconds=60)
    page = chromium.new_page(viewport={"width": 390, "height": 844})
    page.goto(f"{base}/workflows?state=ready&state=paused")
    rows = page.locator("tr[data-workflow-id]")
    expect(rows).to_have_count(3)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate(
        "(() => { const box = document.querySelector('table.list').closest('.scroll');"
        " return box.scrollWidth <= box.clientWidth + 1; })()"
    ), "the table's columns run past its box: a phone must scroll sideways to read a row"
    for n in range(3):
        row = rows.nth(n)
        for cell in ("a", "[data-state]", "td[data-label=Step]", "td[data-label=Changed]"):
            assert within_viewport(page, row.locator(cell).first), (n, cell)
    expect(rows.first.locator("td[data-label=Step]")).to_be_visible()
    shoot(page, db_backend, "workflows-390")

    # The bulk actions: on screen, and they work by touch.
    page.click("summary:has-text('Act on all 3 matching')")
    buttons = page.locator("details.bulk button")
    expect(buttons).to_have_count(5)
    for n in range(5):
        assert within_viewport(page, buttons.nth(n)), buttons.nth(n).text_content()
    page.click("button:has-text('Pause all 3…')")
    expect(page.locator("[data-dry-run]")).to_contain_text("would pause: 2")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert within_viewport(page, page.locator("button:has-text('Yes, pause 2 workflows')"))
    shoot(page, db_backend, "bulk-dry-run-390")
    page.close()


def test_at_390_px_a_filtered_list_opens_with_its_rows_first_and_wide_tables_say_so(
    chromium, serve, gd, scenario: Scenario
):
    """A link to a filtered list, opened on a phone: the filter panel is closed (it says how
    many filters are set) so the rows are in the first screen; on a wide screen it stays open.
    A table whose columns run past its box says that more columns scroll sideways."""
    from playwright.sync_api import expect

    base = serve_dashboard(serve, gd, refresh_seconds=60)
    phone = chromium.new_page(viewport={"width": 390, "height": 844})
    phone.goto(f"{base}/workflows?state=ready&state=paused&type=DashApproval")
    expect(phone.locator("details.more [data-filters-set]")).to_have_text("(2 set)")
    assert phone.evaluate("document.querySelector('details.more').open") is False
    first = phone.locator("tr[data-workflow-id]").first
    box = first.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 844, box  # in the first screen

    seen_wide = []
    for page_path in ("/waiting", "/"):
        phone.goto(base + page_path)
        wide = phone.evaluate(
            "Array.from(document.querySelectorAll('.scroll')).map(b => ["
            " b.scrollWidth > b.clientWidth + 1, b.hasAttribute('data-wider'),"
            " getComputedStyle(b, '::before').content])"
        )
        assert wide, page_path
        for overflows, marked, hint in wide:
            assert overflows == marked, (page_path, wide)
            assert ("scroll sideways" in hint) == overflows, (page_path, wide)
            seen_wide.append(overflows)
    assert any(seen_wide), "no table ran past its box at 390 px: the hint went untested"
    phone.close()

    desk = chromium.new_page(viewport={"width": 1100, "height": 900})
    desk.goto(f"{base}/workflows?state=ready&state=paused&type=DashApproval")
    assert desk.evaluate("document.querySelector('details.more').open") is True
    assert desk.evaluate("document.querySelectorAll('.scroll[data-wider]').length") == 0
    desk.close()


def test_the_overview_chart_has_a_time_axis_under_its_bars(chromium, serve, gd, scenario):
    """Five times, a quarter hour apart, left to right under the bars, none overlapping, and
    the axis named: a reader sees when, not only how many."""
    base = serve_dashboard(serve, gd, refresh_seconds=60)
    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    page.goto(base + "/")
    chart = page.locator("svg[data-sparkline]")
    bars_bottom = page.evaluate(
        "document.querySelector('svg[data-sparkline] line.base').getBoundingClientRect().bottom"
    )
    ticks = page.locator("svg[data-sparkline] [data-time-axis] text[data-tick]")
    boxes = [ticks.nth(n).bounding_box() for n in range(ticks.count())]
    labels = [ticks.nth(n).text_content() for n in range(ticks.count())]
    assert len(boxes) == 5 and all(b is not None and b["width"] > 0 for b in boxes), labels
    assert all(b["y"] >= bars_bottom - 1 for b in boxes)  # below the bars, not over them
    for left, right in itertools.pairwise(boxes):
        assert left["x"] + left["width"] <= right["x"], labels  # in order, none overlapping
    chart_box = chart.bounding_box()
    assert chart_box is not None
    assert all(chart_box["x"] - 1 <= b["x"] <= chart_box["x"] + chart_box["width"] for b in boxes)
    name = page.locator("svg[data-sparkline] [data-time-axis] text.axis-label")
    assert name.text_content() == "Time (UTC)" and name.bounding_box()["width"] > 0
    page.close()
