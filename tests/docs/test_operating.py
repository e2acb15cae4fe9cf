"""docs/operating.md's 3 a.m. walkthrough, as an on-call engineer types it: the page's code
leaves three orders paused at a failing step, then every ``$ geneva-drive`` command the page
shows runs in that directory, in order, and prints what the page shows."""

from __future__ import annotations

from tests.docs import transcripts
from tests.docs.test_snippets import DOCS, page_environment, run_page

PAGE = DOCS / "operating.md"


def test_the_walkthrough_prints_what_the_page_shows(tmp_path):
    run_page(PAGE, tmp_path)

    ran = transcripts.check(
        PAGE, tmp_path, page_environment(), exit_codes={"geneva-drive resume 4": 1}
    )

    assert ran[2:] == [
        "geneva-drive stats",
        "geneva-drive list --where state=paused",
        "geneva-drive show 1",
        'geneva-drive resume 1 --reason "gateway back (INC-4711)"',
        "geneva-drive retry --where state=paused --where error_class=ConnectionError",
        "geneva-drive resume 4",
    ]
