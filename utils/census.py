"""
Which tests of a tree leave process-global state changed: runs them under the global-state guard
(`utils/pytest_global_state.py`) and prints, grouped by what changed, each test that changed it.

Usage:

    python utils/census.py TESTS [-n N] [-- PYTEST_ARGS...]

TESTS is a test folder or file, e.g. a clone's `tests/trainer`. pytest runs from the folder above the tree's topmost
package (the first folder up from TESTS without an `__init__.py`: a repository's root for upstream's `tests/`), as the
tree's own CI would, so that relative paths the tests write land where they would there. Serially by default; `-n N`
runs N pytest-xdist workers and names the same tests: the guard charges a file left in the shared working directory to
the test whose worker made it, and what no worker's Python made (a subprocess's file) is attributed by the controller at
the end, to the one test that saw it appear, or to none, with the tests that could have left it. Arguments after `--` go
to pytest as they are (`-k`, `--timeout 900`, ...). The Python running this script runs the tests: its packages, and
`PYTHONPATH`, are theirs.

It counts leaks, each a test and what it left changed, once however often reported. What the tests leave in the
folders the guard watches (the working directory, pytest's rootdir) the guard deletes at the test's teardown when the
test's own Python made it; the rest (a subprocess's files, ``torch.save``'s), when it was not there when the census
started, the census removes at the end, and says so: the guard sees a file only when it appears, so a file left by one
census would hide the test that leaves it from the next (removing only what appeared during this run, rather than
copying the tree, keeps a clone's root untouched and costs nothing; a leftover from an earlier plain pytest run still
hides its test).

A progress line while it runs; pytest's own output goes to a file, its last line is shown. Exit status 0 whatever the
census finds, 2 on bad input (no such file or folder, options pytest refuses, no test collected).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from workbench.args import Parser
from workbench.testenv import usage_error


UTILS = Path(__file__).resolve().parent


def run_root(tests: Path) -> Path:
    """The folder above the topmost package holding TESTS (TESTS itself when it is not in a package)."""
    folder = tests if tests.is_dir() else tests.parent
    while (folder / "__init__.py").exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def read_log(path: Path) -> dict:
    """The guard's `--global-state-log` file: tests collected, the folders it watched, the tests run, the leaks (test,
    what, how; each once) and the entries left that it could not attribute (what, candidate tests)."""
    log = {"collected": 0, "folders": {}, "run": set(), "leaks": set(), "unattributed": []}
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        record = json.loads(line)
        if "collected" in record:
            log["collected"] = max(log["collected"], record["collected"])  # each xdist worker collects every test
            log["folders"].update(record["folders"])
        elif "test" in record:
            log["run"].add(record["test"])
            log["leaks"].update((record["test"], what, how) for what, how in record["changed"])
        elif len(record["tests"]) == 1:
            log["leaks"].add((record["tests"][0], record["left"], "left behind"))
        else:
            log["unattributed"].append((record["left"], record["tests"]))
    return log


def table(leaks: set, unattributed: list) -> list[str]:
    """What changed, then each test that changed it and how, grouped and sorted; then what no test could be charged
    with, with the tests that could have left it."""
    groups = defaultdict(list)
    for test, what, how in leaks:
        groups[what].append((test, how))
    lines = []
    for what in sorted(groups, key=lambda w: (-len(groups[w]), w)):
        lines.append(f"{what} ({len(groups[what])} test{'s' if len(groups[what]) != 1 else ''})")
        lines += [f"  {test}  {how}" for test, how in sorted(groups[what])]
    for what, tests in sorted(unattributed):
        lines.append(f"{what} (not attributed: left while these ran on different workers)")
        lines += [f"  {test}" for test in sorted(tests)]
    return lines


def listings(tests: Path) -> dict[str, set]:
    """The entries of each readable folder from TESTS up to the filesystem's root: the watched folders are among them
    (one not listed here is never cleaned)."""
    found = {}
    for folder in [tests, *tests.parents] if tests.is_dir() else tests.parents:
        try:
            found[str(folder)] = set(os.listdir(folder))
        except OSError:
            pass
    return found


def remove_left(log: dict, before: dict[str, set]) -> list[str]:
    """Removes each entry the tests left in a watched folder that was not there before the census and is still there
    (the guard deleted those the tests' Python made); returns them."""
    removed = []
    for what in sorted({what for _, what, _ in log["leaks"]} | {what for what, _ in log["unattributed"]}):
        label, _, name = what.partition(": ")
        folder, name = log["folders"].get(label), name.rstrip("/")
        if folder is None or name in before.get(os.path.realpath(folder), {name}):
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            removed.append(path)
        elif os.path.lexists(path):
            os.unlink(path)
            removed.append(path)
    return removed


def _count(things, one: str, many: str = "") -> str:
    return f"{len(things)} {one if len(things) == 1 else many or one + 's'}"


def _progress(text: str, last: list) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}", end="", file=sys.stderr, flush=True)
    elif time.monotonic() - last[0] >= 30:
        print(text, file=sys.stderr, flush=True)
        last[0] = time.monotonic()


def census(tests: Path, workers: int, pytest_args: list[str]) -> int:
    tests = tests.resolve()
    root, before = run_root(tests), listings(tests)
    with tempfile.TemporaryDirectory(prefix="census-") as scratch:
        log, output = Path(scratch) / "global_state.jsonl", Path(scratch) / "pytest.out"
        cmd = [sys.executable, "-m", "pytest", "-p", "pytest_global_state", "-p", "no:cacheprovider"]
        cmd += [f"--global-state-log={log}", "-q", "-rN", str(tests)]
        options = (["-n", str(workers)] if workers else []) + pytest_args
        cmd += options
        # pytest runs from the tree's root: a relative PYTHONPATH entry (e.g. build/stock/src) means the caller's folder
        paths = [str(UTILS)] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        last = [time.monotonic()]
        with open(output, "w", encoding="utf-8") as out:
            process = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
            while process.poll() is None:
                time.sleep(1)
                found = read_log(log)
                run, leaks = len(found["run"]), len(found["leaks"])
                _progress(f"census: {run}/{found['collected']} tests run, {leaks} leaks", last)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        found = read_log(log)
        pytest_lines = output.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        refusal = usage_error(process.returncode, "\n".join(pytest_lines))
        if refusal:
            print(f"census: pytest refuses {shlex.join(options)!r}: {refusal}", file=sys.stderr)
            return 2
        print(f"census: ran {' '.join(cmd[1:])} (in {root})", file=sys.stderr)
        if not found["collected"]:
            print(f"census: no test collected in {tests} (pytest exit status {process.returncode})", file=sys.stderr)
            print("\n".join(pytest_lines[-20:]), file=sys.stderr)
            return 2
    leaks, unattributed = found["leaks"], found["unattributed"]
    leakers = {test for test, _, _ in leaks}
    summary = (
        f"{len(found['run'])} of {found['collected']} tests run, {_count(leaks, 'leak')} by {_count(leakers, 'test')}"
    )
    print(f"census of {tests}: {summary}, {_count(unattributed, 'left entry', 'left entries')} not attributed")
    print(f"pytest: {pytest_lines[-1].strip('= ') if pytest_lines else '(no output)'}")
    if leaks or unattributed:
        print()
        print("\n".join(table(leaks, unattributed)))
    for path in remove_left(found, before):
        print(f"census: removed {path} (left by the tests)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = Parser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("tests", type=Path, help="a test folder or file")
    parser.add_argument("-n", type=int, default=0, metavar="N", help="pytest-xdist workers (default: serial)")
    args = parser.parse_args(own)
    if not args.tests.exists():
        print(f"census: no such file or folder: {args.tests}", file=sys.stderr)
        return 2
    return census(args.tests, args.n, pytest_args)


if __name__ == "__main__":
    sys.exit(main())
