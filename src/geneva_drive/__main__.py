"""``python -m geneva_drive``: the ``geneva-drive`` command."""

from geneva_drive.cli import main

main()
