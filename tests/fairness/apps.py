"""Workflows with and without a fairness key, for the tests and for
`geneva-drive worker --app tests.fairness.apps`. The tenant is the hero's e-mail domain."""

from __future__ import annotations

import os
import time
from typing import Any

from geneva_drive import Workflow, step
from tests.support.app import Account

# How long a body of the process tests works (its workload, not a synchronisation).
BODY_SECONDS = float(os.environ.get("GD_TEST_BODY_SECONDS", "0"))


def tenant_of(workflow: Any) -> str:
    account: Account = workflow.hero
    return account.email.split("@")[1]


class FairCharge(Workflow):
    """Claims rotate among tenants."""

    fairness_key = tenant_of

    @step
    def charge(self) -> None:
        if BODY_SECONDS:
            time.sleep(BODY_SECONDS)  # the step's work


class PlainCharge(Workflow):
    """The same, without a key: claimed in the ordinary order."""

    @step
    def charge(self) -> None:
        if BODY_SECONDS:
            time.sleep(BODY_SECONDS)  # the step's work


class TwoSteps(Workflow):
    fairness_key = tenant_of

    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class FairChargeDirect(Workflow):
    """FairCharge without the hero's load in phase 1: on PostgreSQL the statement that
    finishes a workflow takes a key's turn and starts this step itself (``queries.handover``)."""

    may_proceed_without_hero = True
    fairness_key = tenant_of

    @step
    def charge(self) -> None:
        if BODY_SECONDS:
            time.sleep(BODY_SECONDS)  # the step's work
