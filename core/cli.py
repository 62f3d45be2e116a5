"""One way to read a command line, for every entry point (``python -m …``, the benchmarks).

argparse answers ``--help`` with the usage and exits 0, and refuses an unknown argument with the usage and
exit status 2; an entry point parses its arguments first, so neither starts anything.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parser(doc: str | None, prog: str, *, summary: bool = False) -> argparse.ArgumentParser:
    """A parser named like the command a person types (``python -m devstack.run``), described by the module's
    docstring, kept as written (``summary``: its first line only)."""
    description = (doc or "").strip()
    if summary:
        description = description.splitlines()[0] if description else ""
    return argparse.ArgumentParser(prog=prog, description=description or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def no_arguments(doc: str | None, prog: str, argv: Sequence[str] | None = None) -> None:
    """For an entry point that takes no arguments: ``--help`` is answered, anything else refused."""
    parser(doc, prog).parse_args(argv)
