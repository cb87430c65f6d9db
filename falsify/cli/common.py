"""What every command module shares: one usage error, one parser class.

Every verb module raises `UsageError` for bad input (exit 2, one line on stderr) and builds its
parsers with `Parser`, whose `error` raises instead of printing argparse's usage and exiting.
"""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")
