"""The database worker, for running it from Python (``geneva-drive worker`` from a shell).

A public path the README documents; the worker itself lives in ``runtime.worker``.
"""

from geneva_drive.runtime.worker import Worker

__all__ = ["Worker"]
