"""Deploy safety: which in-flight rows would the code loaded now strand?

Nothing is replayed, so a deploy can only break a row by removing what it names: its workflow
class (the stored ``type``), its hero's class (``hero_type``), or the step it stands at. Such a
row is *stranded*: a worker leaves a row of an unknown class alone for ever, and a row at an
unknown step pauses with "step not defined" when it runs. Rows standing at a ``removed_step``
gravestone are listed too — they are skipped past, and the gravestone must stay until they are
gone — but they strand nothing.

:func:`assess` is a pure function of the in-flight groups (``queries.deploy``) and the code
loaded (:class:`LoadedCode`); :func:`check` reads one and the other. ``geneva-drive check``
prints the report (exit 1 when anything is stranded), and a worker logs its summary at start.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from geneva_drive.definition.workflow import Workflow
from geneva_drive.storage.heroes import loaded_hero_types
from geneva_drive.storage.queries.deploy import PAUSED, InFlightGroup, in_flight_groups

# The workflow states a group's rows can be in: a workflow paused while ready or running
# keeps its execution, so it is counted with that execution's state.
_WORKFLOW_STATES = {
    "in_progress": ("performing", "paused"),
    "scheduled": ("ready", "paused"),
    "waiting": ("ready", "paused"),
    PAUSED: ("paused",),
}
# The states the verbs a fix suggests act on (admin.act.ALLOWED): a fix's filter names them,
# so that it selects the in-flight rows it is about, never finished or canceled ones.
_MOVABLE = ("ready", "paused")  # resume-at, skip
_ONGOING = ("ready", "performing", "paused")  # cancel


class Problem(StrEnum):
    UNKNOWN_WORKFLOW_TYPE = "unknown_workflow_type"
    UNKNOWN_HERO_TYPE = "unknown_hero_type"
    UNKNOWN_STEP = "unknown_step"
    REMOVED_STEP = "removed_step"


@dataclass(frozen=True)
class LoadedCode:
    """The workflow classes (by stored ``workflow_type``) and hero class names loaded."""

    workflows: Mapping[str, type[Workflow]]
    hero_types: Collection[str]

    @classmethod
    def now(cls) -> LoadedCode:
        base = Workflow.__mapper__
        workflows = {
            str(identity): mapper.class_
            for identity, mapper in list(base.polymorphic_map.items())
            if mapper is not base
        }
        return cls(workflows=workflows, hero_types=frozenset(loaded_hero_types()))


@dataclass(frozen=True)
class Finding:
    """One problem of one group of in-flight rows: what is wrong, and what to do about it."""

    problem: Problem
    stranded: bool
    group: InFlightGroup
    message: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return {"problem": self.problem.value, "stranded": self.stranded, **asdict(self.group)} | {
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Report:
    in_flight: int  # rows checked
    findings: tuple[Finding, ...]

    @property
    def stranded(self) -> bool:
        return any(f.stranded for f in self.findings)

    @property
    def stranded_rows(self) -> int:
        # A group can be stranded twice over (class and hero class): count its rows once.
        groups = {f.group for f in self.findings if f.stranded}
        return sum(g.count for g in groups)

    @property
    def gravestone_rows(self) -> int:
        return sum(f.group.count for f in self.findings if f.problem is Problem.REMOVED_STEP)

    def summary(self, *, hint: bool = True) -> str:
        """One line; ``hint``: point to ``geneva-drive check`` for the details."""
        gravestones = (
            f"; {self.gravestone_rows} at removed_step gravestones (keep them)"
            if self.gravestone_rows
            else ""
        )
        if not self.stranded:
            return f"{self.in_flight} in-flight row(s), none stranded by this code{gravestones}"
        problems = sum(1 for f in self.findings if f.stranded)
        return (
            f"{self.stranded_rows} of {self.in_flight} in-flight row(s) would be stranded by "
            f"this code ({problems} problem(s)){gravestones}"
            + ("; run `geneva-drive check --app …` for what to do" if hint else "")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "stranded": self.stranded,
            "in_flight": self.in_flight,
            "stranded_rows": self.stranded_rows,
            "gravestone_rows": self.gravestone_rows,
            "findings": [f.to_json() for f in self.findings],
        }


def check(session: Session, code: LoadedCode | None = None) -> Report:
    """The report for the rows in flight now and the code loaded now (or ``code``)."""
    return assess(in_flight_groups(session), code or LoadedCode.now())


def assess(groups: Collection[InFlightGroup], code: LoadedCode) -> Report:
    findings = tuple(finding for group in groups for finding in _findings(group, code))
    return Report(in_flight=sum(g.count for g in groups), findings=findings)


def log_summary(sessions: sessionmaker[Session], logger: logging.Logger) -> None:
    """The one line a worker logs at start (a warning when rows would be stranded)."""
    try:
        with sessions() as session, session.begin():
            report = check(session)
    except Exception as error:  # a diagnostic: it must never keep a worker from starting
        logger.warning("deploy check skipped: %s: %s", type(error).__name__, error)
        return
    level = logging.WARNING if report.stranded else logging.INFO
    logger.log(level, "deploy check: %s", report.summary())


# -- the findings, one per problem -------------------------------------------------------


def _findings(group: InFlightGroup, code: LoadedCode) -> list[Finding]:
    found: list[Finding] = []
    cls = code.workflows.get(group.workflow_type)
    if cls is None:
        found.append(_unknown_type(group, code))
    elif group.step is not None:
        definition = cls.steps.named(group.step)
        if definition is None:
            found.append(_unknown_step(group, cls))
        elif definition.removed:
            found.append(_gravestone(group))
    if group.hero_type is not None and group.hero_type not in code.hero_types:
        found.append(_unknown_hero(group))
    return found


def _rows(group: InFlightGroup) -> str:
    state = "paused workflow(s)" if group.state == PAUSED else f"{group.state} row(s)"
    return f"{group.count} {state} of {group.workflow_type} (e.g. id {group.first_id})"


def _unknown_type(group: InFlightGroup, code: LoadedCode) -> Finding:
    name = group.workflow_type
    close = difflib.get_close_matches(name, list(code.workflows), n=1)
    renamed = f" on it (renamed to {close[0]}?)" if close else " on it"
    return Finding(
        Problem.UNKNOWN_WORKFLOW_TYPE,
        True,
        group,
        f"{_rows(group)}: no Workflow class with workflow_type {name!r} is loaded",
        f"if the class was renamed, set workflow_type = {name!r}{renamed}; if its module is "
        f"not imported, add it with --app; if it was deleted, let its rows finish or cancel "
        f"them first (geneva-drive cancel --where type={name} "
        f"--where state={','.join(_ONGOING)})",
    )


def _unknown_step(group: InFlightGroup, cls: type[Workflow]) -> Finding:
    step = group.step or ""
    known = [d.name for d in cls.steps.runnable() if d.name]
    close = difflib.get_close_matches(step, known, n=1)
    target = close[0] if close else "STEP"
    renamed = f" (to {close[0]!r}?)" if close else ""
    these = _these(group)
    if group.state == PAUSED:  # resume would refuse them: someone must move them on
        fix = (
            f"resume would refuse a step that is gone: after the deploy, move them with "
            f"geneva-drive resume-at {target} {these}; or declare removed_step({step!r}) in "
            f"{cls.__name__} where it was, and geneva-drive skip {these} moves them past it"
        )
    else:
        fix = (
            f"if the step was deleted, declare removed_step({step!r}) in {cls.__name__} where "
            f"it was, so its rows skip past it; if it was renamed{renamed}, move them there: "
            f"geneva-drive resume-at {target} {these}"
        )
    return Finding(
        Problem.UNKNOWN_STEP,
        True,
        group,
        f"{_rows(group)} stand at step {step!r}, which {cls.__name__} no longer defines "
        f"(its steps: {', '.join(known) or 'none'})",
        fix,
    )


def _these(group: InFlightGroup) -> str:
    """The filters naming a group's in-flight workflows, for a fix's bulk command (which shows
    what it would change and asks before it writes): ``type`` and ``current_step`` match
    finished and canceled workflows too, ``state`` keeps to the ones the verb can move."""
    states = [s for s in _WORKFLOW_STATES.get(group.state, _MOVABLE) if s in _MOVABLE]
    return (
        f"--where type={group.workflow_type} --where current_step={group.step or ''} "
        f"--where state={','.join(states or _MOVABLE)}"
    )


def _gravestone(group: InFlightGroup) -> Finding:
    step = group.step or ""
    these = _these(group)
    if group.state == PAUSED:
        fix = (
            f"resume refuses a removed step: geneva-drive skip {these} moves them past it, "
            f"or geneva-drive resume-at STEP {these}; keep removed_step({step!r}) until then"
        )
    else:
        fix = f"none needed: they skip past it; keep removed_step({step!r}) until they are gone"
    return Finding(
        Problem.REMOVED_STEP,
        False,
        group,
        f"{_rows(group)} stand at removed_step({step!r})",
        fix,
    )


def _unknown_hero(group: InFlightGroup) -> Finding:
    hero = group.hero_type
    return Finding(
        Problem.UNKNOWN_HERO_TYPE,
        True,
        group,
        f"{_rows(group)} have hero_type {hero!r}, which names no mapped class loaded",
        f"add the module that defines {hero} with --app (or import it from the workflow's "
        f"module); if the model was renamed, keep a mapped class named {hero}",
    )
