"""``python -m flyarchive.cli``: the ``flyarchive`` command."""

from flyarchive.cli.commands import run

run()
