"""fairness.py's workflows (``geneva-drive worker --app gd_fair_app``): one no-op step,
without and with a fairness key. Apart from ``gd_app``, whose workers must claim as before: a
worker that has loaded a keyed class claims fairly for every class.

The key is the tenant the creating code sets in ``TENANT`` (the callable runs in create(), in
the caller's context).
"""

from __future__ import annotations

from contextvars import ContextVar

from geneva_drive import Workflow, step

TENANT: ContextVar[str] = ContextVar("TENANT", default="a")


class BenchPlainOne(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        pass


class BenchFairOne(Workflow):
    may_proceed_without_hero = True
    fairness_key = lambda wf: TENANT.get()  # noqa: E731

    @step
    def one(self) -> None:
        pass
