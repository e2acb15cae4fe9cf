"""admin.bulk: an action over a filter, in batches, each its own transaction."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import sessionmaker

from geneva_drive import admin
from geneva_drive.admin import AdminInputError, WorkflowFilter
from tests.admin.apps import AdminFlaky, AdminThreeSteps


def _states(session, ids):
    session.expire_all()
    return [admin.show(session, i).workflow.state for i in ids]


def test_bulk_pauses_what_it_can_across_batches_and_lists_what_it_refused(session, make, gd):
    ready = [make(AdminThreeSteps, run=1).id for _ in range(5)]
    paused = make(AdminFlaky, run=2).id  # already paused: refused
    done = make(AdminThreeSteps, run="all").id  # not selected
    where = WorkflowFilter(state=("ready", "paused"))

    result = admin.bulk(gd.engine, "pause", where, actor="ops", reason="incident", batch_size=2)

    assert result.matched == 6
    assert sorted(result.changed) == sorted(ready)
    ((refused_id, why),) = result.refused
    assert refused_id == paused and f"AdminFlaky id={paused}" in why and "paused" in why
    assert _states(session, ready) == ["paused"] * 5
    assert _states(session, [done]) == ["finished"]
    actions = admin.show(session, ready[0]).actions
    assert [(a.action, a.actor, a.reason) for a in actions] == [("pause", "ops", "incident")]


def test_a_dry_run_decides_the_same_way_and_writes_nothing(session, make, gd):
    ready = make(AdminThreeSteps, run=1).id
    paused = make(AdminFlaky, run=2).id

    result = admin.bulk(
        sessionmaker(gd.engine), "resume", WorkflowFilter(), actor="ops", dry_run=True
    )

    assert result.dry_run and result.matched == 2
    assert result.changed == (paused,)
    assert [i for i, _ in result.refused] == [ready]
    assert _states(session, [ready, paused]) == ["ready", "paused"]
    assert admin.show(session, paused).actions == ()


def test_bulk_passes_the_actions_arguments_and_refuses_unknown_ones(session, make, gd):
    first = make(AdminFlaky, run=2).id
    second = make(AdminFlaky, run=2).id

    result = admin.bulk(
        gd.engine, "resume_at", WorkflowFilter(state="paused"), actor="ops", step="receipt"
    )

    assert sorted(result.changed) == [first, second]
    assert [admin.show(session, i).executions[-1].step_name for i in (first, second)] == [
        "receipt",
        "receipt",
    ]
    with pytest.raises(AdminInputError, match="step required"):
        admin.bulk(gd.engine, "resume_at", WorkflowFilter(), actor="ops")
    with pytest.raises(AdminInputError, match="pause takes no arguments"):
        admin.bulk(gd.engine, "pause", WorkflowFilter(), actor="ops", step="x")
    with pytest.raises(AdminInputError, match="unknown action"):
        admin.bulk(gd.engine, "explode", WorkflowFilter(), actor="ops")


def test_bulk_skips_finished_and_canceled_matches_with_a_count_not_a_refusal_each(
    session, make, gd
):
    ready = make(AdminThreeSteps, run=1).id
    make(AdminThreeSteps, run="all")  # finished
    canceled = make(AdminThreeSteps, run=1)
    admin.cancel(session, canceled.id, actor="ops")
    session.commit()
    where = WorkflowFilter(workflow_type="AdminThreeSteps")

    preview = admin.bulk(gd.engine, "cancel", where, actor="ops", dry_run=True)
    result = admin.bulk(gd.engine, "cancel", where, actor="ops")

    for outcome in (preview, result):
        assert outcome.matched == 3
        assert outcome.changed == (ready,)
        assert outcome.refused == ()
        assert outcome.skipped == 2
    assert _states(session, [ready]) == ["canceled"]
    assert [a.action for a in admin.show(session, canceled.id).actions] == ["cancel"]
