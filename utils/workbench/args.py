"""The workbench's command lines: argparse's, refusing bad input in one line (argparse prints its whole usage first)."""

import argparse


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` (its sub-command parsers too) whose refusal is one line, status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help: the usage)\n")
