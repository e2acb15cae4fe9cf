"""Integrations with software geneva-drive does not depend on (installed through extras).

``geneva_drive.contrib.celery`` — run steps on a Celery cluster (``pip install
'geneva-drive[celery]'``). Importing a contrib module without its extra raises an
``ImportError`` that names the extra to install.
"""
