"""The README's "Test your workflows" section runs as written.

Its Python blocks, in order, make one test module (the second block continues the first), which
runs under pytest in a process of its own with nothing but the plugin — on SQLite as the
README says, and on PostgreSQL and MariaDB through ``--geneva-drive-url``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.plugin._support import explain, outcome, run_pytest, url_for

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Test your workflows"


def readme_testing_example() -> str:
    text = README.read_text()
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.DOTALL | re.MULTILINE)
    assert blocks, f"README.md: no ```python block in {SECTION!r}"
    return "\n\n".join(blocks)


def test_the_readme_testing_section_has_the_examples_this_test_counts():
    example = readme_testing_example()

    assert example.count("\ndef test_") == 4
    assert "geneva_drive_session" in example


def test_the_readme_testing_example_passes_as_written(db_backend, request, tmp_path):
    url = url_for(db_backend, request)
    args = ["--geneva-drive-url", url] if url else []

    result = run_pytest(tmp_path, {"test_onboarding.py": readme_testing_example()}, *args)

    assert result.returncode == 0, explain(result)
    assert outcome(result).startswith("4 passed"), explain(result)
