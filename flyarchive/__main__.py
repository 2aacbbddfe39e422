"""``python -m flyarchive``: the ``flyarchive`` command (as ``python -m flyarchive.cli``)."""

from flyarchive.cli.commands import run

run()
