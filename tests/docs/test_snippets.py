"""Every ```python block of the documentation runs as written, and the site builds.

Each page runs in a process of its own, in an empty temporary directory, with no
``GENEVA_DRIVE_*`` variable set: its ``sqlite:///…`` URLs are relative paths, so each page gets a
fresh SQLite database there. A block with a file title (```python title="app.py"```) is that
file: it is written into the directory (blocks with the same title, in order, make one file —
"continuing the module above") and not run by itself; the page's other blocks import it. The
untitled blocks, in page order, make one script run with warnings as errors. When a page
titles ``test_*.py`` files, pytest then runs them there, as a user would. Shell blocks
(```console``, ```bash``) are not run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.plugin._support import explain, outcome, run_pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))  # the "coming from" pages are in a folder of their own


def page_name(page: Path) -> str:
    """The page's path under docs/, e.g. ``coming-from/celery.md`` (the repository's root
    pages, the README, as ``../README.md``)."""
    if not page.is_relative_to(DOCS):
        return f"../{page.relative_to(ROOT).as_posix()}"
    return page.relative_to(DOCS).as_posix()


FENCE = re.compile(r"^```python(?P<attrs>[^\n]*)\n(?P<source>.*?)^```$", re.DOTALL | re.MULTILINE)
TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    title: str | None
    source: str


def python_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        title = TITLE.search(match["attrs"])
        line = text.count("\n", 0, match.start("source")) + 1
        blocks.append(Block(page, line, title["title"] if title else None, match["source"]))
    return blocks


def page_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_DRIVE_")}


def run_page(page: Path, directory: Path) -> None:
    blocks = python_blocks(page)
    files: dict[str, str] = {}
    for block in blocks:
        if block.title is not None:
            files[block.title] = files.get(block.title, "") + block.source + "\n\n"
    tests = {name: source for name, source in files.items() if name.startswith("test_")}
    for name, source in files.items():
        if name not in tests:
            (directory / name).write_text(source)

    script = [
        f"# {page_name(page)}, line {block.line}\n{block.source}"
        for block in blocks
        if not block.title
    ]
    if script:
        (directory / "page.py").write_text("\n\n".join(script))
        result = subprocess.run(
            [sys.executable, "-W", "error", "page.py"],
            cwd=directory,
            env=page_environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"docs/{page_name(page)}: its code failed\n{explain(result)}"
    if tests:
        result = run_pytest(directory, tests)
        expected = sum(source.count("\ndef test_") for source in tests.values())
        assert result.returncode == 0, (
            f"docs/{page_name(page)}: its tests failed\n{explain(result)}"
        )
        assert outcome(result).startswith(f"{expected} passed"), explain(result)


def test_the_pages_with_code_are_the_ones_these_tests_run():
    with_code = {page_name(page) for page in PAGES if python_blocks(page)}

    assert {
        "index.md",
        "getting-started.md",
        "concepts.md",
        "testing.md",
        "workflows.md",
        "starting.md",
        "flow-control.md",
        "exception-policies.md",
        "resumable-steps.md",
        "signals.md",
        "configuration.md",
        "async.md",
        "coming-from/geneva-drive-ruby.md",
        "coming-from/celery.md",
        "coming-from/dbos.md",
        "coming-from/temporal.md",
    } <= with_code
    operating = {"operating.md", "admin-api.md", "dashboard.md", "deploy-check.md"}
    assert operating | {"workers.md", "celery.md"} <= with_code


@pytest.mark.parametrize("page", PAGES, ids=[page_name(page) for page in PAGES])
def test_every_python_fence_of_a_page_is_found(page):
    """A fence the extraction misses (```py, ```python3, an indented fence) would never run."""
    fences = re.findall(r"^\s*```\s*(py|python\S*)\b", page.read_text(), flags=re.MULTILINE)

    assert len(fences) == len(python_blocks(page)), (
        f"docs/{page_name(page)}: write Python examples as ```python fences at the start of a line"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if python_blocks(page)],
    ids=[page_name(page) for page in PAGES if python_blocks(page)],
)
def test_the_code_of_a_page_runs_as_written(page, tmp_path):
    run_page(page, tmp_path)


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        reason = "mkdocs is not installed: pip install -e '.[docs]' (or the dev extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; under CI=true the docs build must run")
        pytest.skip(reason)

    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert result.returncode == 0, explain(result)
    assert (tmp_path / "reference" / "index.html").read_text().count('id="geneva_drive.') > 50


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path):
    """The README's one complete example is a whole program: it runs as a reader saves it."""
    readme = ROOT / "README.md"
    assert len(python_blocks(readme)) == 1, "README.md: keep one complete ```python example"

    run_page(readme, tmp_path)
