"""docs/cli.md against the Typer app: every command has its section, every option of a
command is on the page (in its section, or among the options most commands take), the page
shows no option that does not exist, and its error transcript is what the CLI prints."""

from __future__ import annotations

import re
import subprocess
import sys

import typer

from geneva_drive.cli.main import app
from tests.docs import transcripts
from tests.docs.test_snippets import DOCS, page_environment

PAGE = DOCS / "cli.md"
HEADING = re.compile(r"^###? (?P<title>.*)$", re.MULTILINE)
ROW_OPTIONS = re.compile(r"^\| (?P<cell>[^|]*)\|", re.MULTILINE)
OPTION = re.compile(r"`(?P<option>-{1,2}[a-z][a-z-]*)")


def commands() -> dict[str, set[str]]:
    root = typer.main.get_command(app)
    return {
        name: {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o[0] == "-"}
        for name, command in root.commands.items()  # type: ignore[attr-defined]
    }


def sections() -> dict[str, str]:
    """Each ## or ### heading's text up to the next heading."""
    text = PAGE.read_text()
    found = list(HEADING.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return {m["title"]: text[m.end() : end] for m, end in zip(found, ends, strict=True)}


def table_options(text: str) -> set[str]:
    """The options in the first column of the text's tables."""
    return {o["option"] for row in ROW_OPTIONS.finditer(text) for o in OPTION.finditer(row["cell"])}


COMMON_SECTION = "Options most commands take"


def test_every_command_has_a_section_that_names_each_of_its_options():
    common = table_options(sections()[COMMON_SECTION])
    for name, options in commands().items():
        titles = [t for t in sections() if f"`{name}`" in t]
        assert titles, f"docs/cli.md has no section for `geneva-drive {name}`"
        shown = table_options(sections()[titles[0]])
        missing = options - shown - common - {"--help"}
        assert not missing, f"docs/cli.md, `{name}`: options not on the page: {sorted(missing)}"


def test_the_page_shows_no_option_a_command_does_not_have():
    every = commands()
    common = table_options(sections()[COMMON_SECTION])
    assert common <= set().union(*every.values()) | {"--traceback", "--version"}
    for title, text in sections().items():
        named = [name for name in every if f"`{name}`" in title]
        if not named:
            continue
        allowed = set().union(*(every[name] for name in named))
        extra = table_options(text) - allowed
        assert not extra, f"docs/cli.md, {title}: no such option {sorted(extra)}"


def test_the_error_the_page_shows_is_the_one_the_cli_prints(tmp_path):
    env = page_environment() | {"GENEVA_DRIVE_DATABASE_URL": "sqlite:///app.db"}
    migrate = [sys.executable, "-m", "geneva_drive", "migrate"]
    subprocess.run(migrate, cwd=tmp_path, env=env, check=True, capture_output=True)

    ran = transcripts.check(
        PAGE, tmp_path, env, exit_codes={"geneva-drive list --where sate=paused": 2}
    )

    assert ran == ["geneva-drive list --where sate=paused"]
