"""Start an onboarding workflow for each of some new users; Celery workers run the steps.

    python -m examples.celery.start --users 3

The tables are created first if missing (a real app runs its migrations and
``geneva-drive migrate`` instead).
"""

from __future__ import annotations

import argparse

from sqlalchemy.orm import Session

import geneva_drive
from examples.celery.models import Base, User
from examples.celery.tasks import Onboarding, engine


def start(session: Session, users: int) -> list[Onboarding]:
    """Sign up ``users`` users and start their workflows, in one transaction."""
    signed_up = [User(email=f"user{n}@example.com") for n in range(users)]
    session.add_all(signed_up)
    session.flush()  # their ids, which the workflows refer to
    workflows = [Onboarding.create(session, hero=user) for user in signed_up]
    session.commit()  # now each first step's message goes to the "workflows" queue
    return workflows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=3)
    args = parser.parse_args(argv)

    geneva_drive.install(engine)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        workflows = start(session, args.users)
        print(f"started onboarding workflows {', '.join(str(wf.id) for wf in workflows)}")
    engine.dispose()


if __name__ == "__main__":
    main()
