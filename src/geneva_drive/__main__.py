"""``python -m geneva_drive``: the ``geneva-drive`` command."""

from .cli import main

main()
