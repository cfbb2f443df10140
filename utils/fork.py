#!/usr/bin/env python3
"""Entry point of the workbench (see utils/workbench/__init__.py for what it does)."""

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))

from workbench.cli import main  # noqa: E402


if __name__ == "__main__":
    sys.exit(main())
