"""Output into a pipe or a file is never wrapped or cut: a table row is one line however long,
so ``geneva-drive list | grep OrderFulfillment`` finds whole rows, and ``check``'s suggested
commands can be copied as they are. Each command runs with stdout a pipe and no COLUMNS."""

from __future__ import annotations

import textwrap

from geneva_drive import Workflow, step
from tests.ops_cli._support import command

LONG_TYPE = "OrderFulfillmentForTheWholesaleWarehousesOfTheNorthernRegion"


class PipedOrderFulfillment(Workflow):
    workflow_type = LONG_TYPE
    may_proceed_without_hero = True

    @step
    def reserve_inventory_for_every_line_item_of_the_order(self) -> None:
        pass


def test_a_listed_row_is_one_line_in_a_pipe(session, installed_database_url):
    workflow = PipedOrderFulfillment.create(session)
    session.commit()

    result = command("list", url=installed_database_url, columns=None)

    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if LONG_TYPE in line]
    assert len(rows) == 1, result.stdout
    assert rows[0].split()[:3] == [str(workflow.id), LONG_TYPE, "ready"]
    assert "reserve_inventory_for_every_line_item_of_the_order" in rows[0]


def test_checks_suggested_commands_are_one_line_in_a_pipe(
    session, installed_database_url, tmp_path
):
    PipedOrderFulfillment.create(session)
    session.commit()
    (tmp_path / "piped_release.py").write_text(
        textwrap.dedent(
            f"""
            from geneva_drive import Workflow, step

            class Renamed(Workflow):
                workflow_type = {LONG_TYPE!r}
                may_proceed_without_hero = True

                @step
                def reserve_inventory(self):
                    pass
            """
        )
    )

    result = command(
        "check", "--app", "piped_release", url=installed_database_url, path=tmp_path, columns=None
    )

    assert result.returncode == 1, result.stderr
    (fix,) = [line for line in result.stdout.splitlines() if line.startswith("  fix:")]
    assert "geneva-drive resume-at " in fix
    assert f"type={LONG_TYPE}" in fix
    assert "current_step=reserve_inventory_for_every_line_item_of_the_order" in fix
