"""Housekeeping, for running it from Python (``geneva-drive housekeeping`` from a shell).

A public path the README documents; the passes themselves live in ``runtime.housekeeping``.
"""

from geneva_drive.engine.recovery import recover_execution, recover_expired_leases
from geneva_drive.runtime.housekeeping import gauges, publish_gauges, run, run_exclusive

__all__ = [
    "gauges",
    "publish_gauges",
    "recover_execution",
    "recover_expired_leases",
    "run",
    "run_exclusive",
]
