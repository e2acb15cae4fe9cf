"""The testing page's test module (docs/testing.md, the blocks titled ``test_onboarding.py``)
passes on every database.

``tests/docs`` runs it on SQLite as the page says; this runs the same module under pytest in a
process of its own with nothing but the plugin, on PostgreSQL and MariaDB too, through
``--geneva-drive-url``.
"""

from __future__ import annotations

from tests.docs.test_snippets import DOCS, python_blocks
from tests.plugin._support import explain, outcome, run_pytest, url_for

PAGE = DOCS / "testing.md"
MODULE = "test_onboarding.py"


def module_of_the_testing_page() -> str:
    blocks = [block.source for block in python_blocks(PAGE) if block.title == MODULE]
    assert blocks, f"docs/testing.md: no ```python title={MODULE!r} block"
    return "\n\n".join(blocks)


def test_the_testing_page_has_the_examples_this_test_counts():
    module = module_of_the_testing_page()

    assert module.count("\ndef test_") == 4
    assert "geneva_drive_session" in module


def test_the_module_of_the_testing_page_passes_on_every_database(db_backend, request, tmp_path):
    url = url_for(db_backend, request)
    args = ["--geneva-drive-url", url] if url else []

    result = run_pytest(tmp_path, {MODULE: module_of_the_testing_page()}, *args)

    assert result.returncode == 0, explain(result)
    assert outcome(result).startswith("4 passed"), explain(result)
