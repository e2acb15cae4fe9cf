"""show(), `geneva-drive show` and the dashboard's workflow page: a parent's children, a
child's parent."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from geneva_drive import Workflow, admin, step
from geneva_drive.dashboard import create_app
from geneva_drive.testing import perform_next_step
from tests.children._support import children_of
from tests.ops_cli._support import invoke, invoke_json


class ShKid(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self):
        pass


class ShParent(Workflow):
    may_proceed_without_hero = True

    @step
    def split(self):
        for key in ("a", "b", "c"):
            self.start_child(ShKid, key=key)

    @step(wait_for_children="all")
    def close(self):
        pass


def _family(session):
    parent = ShParent.create(session)
    session.commit()
    perform_next_step(parent)
    a, b, c = children_of(session, parent)
    perform_next_step(a)  # a finished
    b.cancel()
    session.commit()
    return parent, a, b, c


def test_show_counts_a_parents_children_by_state_and_links_them(gd, session):
    parent, a, b, c = _family(session)

    family = admin.show(session, parent.id).family

    assert family is not None and family.parent is None
    assert (family.children_started, family.children_ended, family.children_failed) == (3, 2, 1)
    assert family.children_by_state == {"canceled": 1, "finished": 1, "ready": 1}
    assert [(k.id, k.key, k.workflow_type, k.state) for k in family.children] == [
        (a.id, "a", "ShKid", "finished"),
        (b.id, "b", "ShKid", "canceled"),
        (c.id, "c", "ShKid", "ready"),
    ]


def test_show_names_a_childs_parent_and_key(gd, session):
    parent, a, *_ = _family(session)

    family = admin.show(session, a.id).family

    assert family is not None
    assert family.parent == admin.Relative(parent.id, "ShParent", "ready", None)
    assert family.key == "a"
    assert family.children == ()


def test_show_of_a_workflow_without_family_has_none(gd, session):
    kid = ShKid.create(session)
    session.commit()

    assert admin.show(session, kid.id).family is None


def test_the_cli_shows_the_children_and_the_parent(gd, session, installed_database_url):
    parent, a, b, _ = _family(session)

    shown = invoke(installed_database_url, "show", str(parent.id))
    assert shown.exit_code == 0, shown.output
    assert "children: 3 started, 2 ended (1 canceled) — 1 canceled, 1 finished, 1 ready" in (
        shown.output
    )
    assert re.search(rf"\n{b.id}\s+b\s+ShKid\s+canceled", shown.output)

    child = invoke(installed_database_url, "show", str(a.id))
    assert f"parent: {parent.id} ShParent ready   key: a" in child.output

    as_json = invoke_json(installed_database_url, "show", str(a.id))
    assert as_json["family"]["parent"]["id"] == parent.id


def test_the_dashboard_links_a_parent_and_its_children(gd, session):
    parent, a, *_ = _family(session)

    with TestClient(create_app(engine=gd.engine, clock=gd.clock)) as client:
        parent_page = client.get(f"/workflows/{parent.id}").text
        child_page = client.get(f"/workflows/{a.id}").text

    assert "3 started · 2 ended (1 canceled)" in parent_page
    assert f'href="/workflows/{a.id}">#{a.id}</a> <span class="mono">a</span>' in parent_page
    assert f'href="/workflows/{parent.id}">#{parent.id} ShParent</a>' in child_page
