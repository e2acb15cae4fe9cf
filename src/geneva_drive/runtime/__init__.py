"""Processes that run the engine: the worker, housekeeping, the backends, start-up checks,
the deploy check and the wiring (``configure``), the one place that builds a backend."""
