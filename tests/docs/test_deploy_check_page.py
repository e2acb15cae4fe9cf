"""docs/deploy-check.md as a reader runs it: yesterday's code leaves rows at a step that
today's code renamed; `check` says so (exit 1) with the fix, the fix moves them, and `check`
passes."""

from __future__ import annotations

from tests.docs import transcripts
from tests.docs.test_snippets import DOCS, page_environment, run_page

PAGE = DOCS / "deploy-check.md"


def test_the_check_finds_the_stranded_rows_and_its_fix_clears_them(tmp_path):
    run_page(PAGE, tmp_path)

    ran = transcripts.check(
        PAGE, tmp_path, page_environment(), exit_codes={"geneva-drive check --app shop": [1, 0]}
    )

    assert ran.count("geneva-drive check --app shop") == 2
