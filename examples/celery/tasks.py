"""The module every Celery worker (and the dispatcher) imports: the Celery app, geneva-drive
configured on it, and the workflows.

    celery -A examples.celery.tasks worker -Q workflows,mail
    geneva-drive dispatch --app examples.celery.tasks:app      # one, for waits over 5 minutes
                                                               # and dead workers' steps

``$CELERY_BROKER_URL`` names the broker (default: Redis on localhost),
``$GENEVA_DRIVE_DATABASE_URL`` the database (default: ``shop.db`` here; use PostgreSQL or
MariaDB when the workers run on several machines).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import geneva_drive
from celery import Celery  # type: ignore[import-untyped]
from examples.celery.models import User
from geneva_drive import Workflow, step
from geneva_drive.contrib.celery import CeleryBackend

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0")
DATABASE_URL = os.environ.get("GENEVA_DRIVE_DATABASE_URL", "sqlite:///shop.db")

app = Celery("shop", broker=BROKER_URL)
engine = geneva_drive.create_engine(DATABASE_URL)
# Configured when the module is imported, as a Celery app module is: by each worker (a prefork
# child drops the connections it inherited) and by the code that starts workflows. The backend
# registers one task on the app, geneva_drive.perform_step(execution_id).
geneva_drive.configure(engine=engine, backend=CeleryBackend(app))


def send_mail(user: User, subject: str) -> None:
    print(f"mail to {user.email}: {subject}", flush=True)


class Onboarding(Workflow):
    job_options = {"queue": "workflows"}  # every step's Celery queue...

    @step
    def welcome(self) -> None:
        user: User = self.hero
        send_mail(user, "Welcome!")
        user.welcomed_at = datetime.now(UTC)

    # ...or one step's. A wait up to CeleryBackend's eta_horizon (5 minutes) goes out at once
    # as an ETA message; a longer one is sent by `geneva-drive dispatch` when it comes near.
    @step(wait=timedelta(seconds=2), job_options={"queue": "mail", "priority": 5})
    def nudge(self) -> None:
        user: User = self.hero
        send_mail(user, "How is it going?")
        user.nudged_at = datetime.now(UTC)
