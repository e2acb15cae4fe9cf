"""The ``geneva-drive`` command. A projection of the admin API, the worker and the migrations;
each command imports what it uses only when it runs, so ``--help`` needs no optional extra."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    import sys

    from geneva_drive.cli.collector import collector_paused

    with collector_paused(sys.argv[1:] if argv is None else argv):  # before the imports
        from geneva_drive.cli.main import main as run

        run(argv)
