"""The argument parser every `testbed` command uses: a usage error is one line on stderr and exit status 2.

Its own module (imported by the CLI and by `testbed run`'s option parsing in the runner) so that the runner does not
import the CLI that imports it.
"""

from __future__ import annotations

import argparse
import sys


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 (argparse prints the whole usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
