"""`python utils/repro` (what `make repro` runs), or `python -m repro` with utils/ on the path: see `__init__.py`."""

import os
import sys


if not __package__:  # run as a folder: import the package from utils/ (also resume_diff), not from this folder
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    from repro.cli import main
except KeyboardInterrupt:  # Ctrl-C while a worker starts: the driver says what was left
    sys.exit(130)

sys.exit(main())
