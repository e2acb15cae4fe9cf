"""geneva-drive on a Celery cluster: the app module Celery workers import, and a script that
starts workflows. From the repository root (see examples/README.md):

    celery -A examples.celery.tasks worker -Q workflows,mail
    python -m examples.celery.start --users 3
"""
