"""A page's ```console transcripts, run as a reader types them, their output compared.

A transcript is ``$ command`` lines, each followed by the output it shows. The commands run in
order in one directory (the one the page's code ran in, see ``test_snippets.run_page``), so a
transcript can act on what an earlier one showed. Supported commands: ``geneva-drive ...``
(run as ``python -m geneva_drive``), ``python ...`` and ``export NAME=VALUE``.

The comparison keeps what a reader relies on and lets go of what changes from run to run:

- timestamps (``2026-12-01 02:51:44``, ``12-01 02:51:44``, ISO 8601) and durations
  (``4.6s``) compare equal to any other;
- a traceback's file paths compare by the file's name (``/srv/shop/shop.py`` = ``shop.py``);
- runs of spaces compare equal to any other run of two or more (a table's column widths follow
  the widest value: a longer duration widens its column);
- a line ``...`` stands for any number of lines (a traceback's frames);
- a shown prompt answer (``[y/N]: y``) is typed into the command's input, and the prompt's
  output line ends there, as on a terminal (where the answer is echoed).

Output is stdout and stderr together, as on a terminal.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

CONSOLE = re.compile(r"^```console\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)
ANSWER = re.compile(r"\[y/N\]: (?P<answer>\w+)$")
NORMAL = (
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00:00)?"), "<time>"),
    (re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<seconds>"),
    (re.compile(r'File "[^"]*/(?=[^/"]+")'), 'File "'),
    (re.compile(r" {2,}"), "  "),
)


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)

    @property
    def answers(self) -> str:
        found = [ANSWER.search(line) for line in self.expected]
        return "".join(f"{m['answer']}\n" for m in found if m)


def commands(page: Path) -> list[Command]:
    """Every ``$`` command of the page's console blocks, in order, with its shown output."""
    found: list[Command] = []
    for block in CONSOLE.finditer(page.read_text()):
        pending = ""
        for line in block["body"].splitlines():
            if pending or line.startswith("$ "):
                text = pending + (line[2:] if not pending else line.strip())
                if text.endswith("\\"):
                    pending = text[:-1].rstrip() + " "
                    continue
                pending = ""
                found.append(Command(text.strip()))
            elif found:
                found[-1].expected.append(line)
    return found


def normal(line: str) -> str:
    for pattern, replacement in NORMAL:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def matches(expected: list[str], actual: list[str]) -> bool:
    if not expected:
        return not actual
    if expected[0].strip() == "...":
        return any(matches(expected[1:], actual[n:]) for n in range(len(actual) + 1))
    return (
        bool(actual)
        and normal(expected[0]) == normal(actual[0])
        and matches(expected[1:], actual[1:])
    )


def run(command: Command, directory: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    words = shlex.split(command.line)
    if words[0] == "export":
        name, _, value = words[1].partition("=")
        env[name] = value
        return 0, []
    programs = {"geneva-drive": [sys.executable, "-m", "geneva_drive"], "python": [sys.executable]}
    assert words[0] in programs, f"a transcript runs geneva-drive, python or export: {command}"
    result = subprocess.run(
        [*programs[words[0]], *words[1:]],
        cwd=directory,
        env=env,
        input=command.answers,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout
    for answer in command.answers.split():  # the prompt's line ends with the echoed answer
        output = output.replace("[y/N]: ", f"[y/N]: {answer}\n", 1)
    return result.returncode, output.splitlines()


def check(
    page: Path,
    directory: Path,
    env: dict[str, str],
    exit_codes: dict[str, int | list[int]] | None = None,
) -> list[str]:
    """Run the page's transcripts; returns the commands run. ``exit_codes``: a command's
    expected exit code where it is not 0 (a list: one per run of that command, in order)."""
    codes = {k: [v] if isinstance(v, int) else list(v) for k, v in (exit_codes or {}).items()}
    ran = []
    for command in commands(page):
        code, actual = run(command, directory, env)
        expected = codes[command.line].pop(0) if codes.get(command.line) else 0
        shown = "\n".join(actual)
        assert code == expected, f"docs/{page.name}: `{command.line}` exited {code}:\n{shown}"
        assert matches(command.expected, actual), (
            f"docs/{page.name}: `{command.line}` printed\n{shown}\n\n"
            f"but the page shows\n" + "\n".join(command.expected)
        )
        ran.append(command.line)
    return ran
