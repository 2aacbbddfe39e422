"""The ``flyarchive`` command line (the console script ``flyarchive = "flyarchive.cli:run"``,
and ``python -m flyarchive.cli``): each subcommand calls one public function.

- :mod:`flyarchive.cli.commands`: the parser, the subcommands but analysis, and
  :func:`main` / :func:`run` (arguments in, exit status out: one line on stderr per error);
- :mod:`flyarchive.cli.args`: what the subcommands share: the parsers of their arguments
  (worlds, times, sizes, GPUs, storage options, world variables, ``where`` masks), the
  arguments of ``render``, and their one-line messages on stderr;
- :mod:`flyarchive.cli.analysis`: the analysis subcommands (``positions``, ``gait``,
  ``export-poses``).
"""

from flyarchive.cli.commands import build_parser, main, run
