"""
Which tests of a tree leave process-global state changed: runs them under the global-state guard
(`utils/pytest_global_state.py`) and prints, grouped by what changed, each test that changed it.

Usage:

    python utils/census.py TESTS [-n N] [-- PYTEST_ARGS...]

TESTS is a test folder or file, e.g. a clone's `tests/trainer`. pytest runs from the folder above the tree's topmost
package (the first folder up from TESTS without an `__init__.py`: a repository's root for upstream's `tests/`), as the
tree's own CI would, so that relative paths the tests write land where they would there. Serially by default, so that
each change is named against the test that made it; `-n N` runs N pytest-xdist workers (faster, attribution not
guaranteed). Arguments after `--` go to pytest as they are (`-k`, `--timeout 900`, ...). The Python running this
script runs the tests: its packages, and `PYTHONPATH`, are theirs.

A progress line while it runs; pytest's own output goes to a file, its last line is shown. Exit status 0 whatever the
census finds, 2 on bad input (no such file or folder, no test collected).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


UTILS = Path(__file__).resolve().parent


def run_root(tests: Path) -> Path:
    """The folder above the topmost package holding TESTS (TESTS itself when it is not in a package)."""
    folder = tests if tests.is_dir() else tests.parent
    while (folder / "__init__.py").exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def read_log(path: Path) -> tuple[int, list[dict]]:
    """(tests collected, one record per test run) from the guard's `--global-state-log` file."""
    collected, tests = 0, []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if "collected" in record:
                collected = max(collected, record["collected"])  # each xdist worker collects every test
            else:
                tests.append(record)
    return collected, tests


def table(tests: list[dict]) -> list[str]:
    """What changed, then each test that changed it and how, grouped and sorted."""
    groups = defaultdict(list)
    for record in tests:
        for what, how in record["changed"]:
            groups[what].append((record["test"], how))
    lines = []
    for what in sorted(groups, key=lambda w: (-len(groups[w]), w)):
        lines.append(f"{what} ({len(groups[what])} test{'s' if len(groups[what]) != 1 else ''})")
        lines += [f"  {test}  {how}" for test, how in sorted(groups[what])]
    return lines


def _progress(text: str, last: list) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}", end="", file=sys.stderr, flush=True)
    elif time.monotonic() - last[0] >= 30:
        print(text, file=sys.stderr, flush=True)
        last[0] = time.monotonic()


def census(tests: Path, workers: int, pytest_args: list[str]) -> int:
    root = run_root(tests)
    with tempfile.TemporaryDirectory(prefix="census-") as scratch:
        log, output = Path(scratch) / "global_state.jsonl", Path(scratch) / "pytest.out"
        cmd = [sys.executable, "-m", "pytest", "-p", "pytest_global_state", "-p", "no:cacheprovider"]
        cmd += [f"--global-state-log={log}", "-q", "-rN", str(tests.resolve())]
        cmd += (["-n", str(workers)] if workers else []) + pytest_args
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(UTILS), os.environ.get("PYTHONPATH")])))
        print(f"census: {' '.join(cmd[1:])} (in {root})", file=sys.stderr)
        last = [time.monotonic()]
        with open(output, "w", encoding="utf-8") as out:
            process = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
            while process.poll() is None:
                time.sleep(1)
                collected, done = read_log(log)
                leaking = sum(1 for record in done if record["changed"])
                _progress(f"census: {len(done)}/{collected} tests run, {leaking} left state changed", last)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        collected, done = read_log(log)
        pytest_lines = output.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        if not collected:
            print(f"census: no test collected in {tests} (pytest exit status {process.returncode})", file=sys.stderr)
            print("\n".join(pytest_lines[-20:]), file=sys.stderr)
            return 2
    leaking = [record for record in done if record["changed"]]
    print(f"census of {tests}: {len(done)} of {collected} tests run, {len(leaking)} left process-global state changed")
    print(f"pytest: {pytest_lines[-1].strip('= ') if pytest_lines else '(no output)'}")
    if leaking:
        print()
        print("\n".join(table(leaking)))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("tests", type=Path, help="a test folder or file")
    parser.add_argument("-n", type=int, default=0, metavar="N", help="pytest-xdist workers (default: serial)")
    args = parser.parse_args(own)
    if not args.tests.exists():
        print(f"census: no such file or folder: {args.tests}", file=sys.stderr)
        return 2
    return census(args.tests, args.n, pytest_args)


if __name__ == "__main__":
    sys.exit(main())
