"""
Runs `utils/repro` (what `make repro` runs once the forks are built) and the torchrun tests of
`tests/workbench/test_distributed_resume.py` over and over, and counts how each run ended (issue 23: about one
`make repro` in ten failed when a DDP process aborted at exit).

Usage:

    .venv/bin/python bench/stress_repro.py [--repro N] [--after-tests M] [--tests K] [--budget-minutes T]
                                           [--nice 19] [--log-dir DIR] [--keep-passing] [-k EXPR] [-- REPRO_ARGS]

Phases, in this order:

1. `--repro N`: `utils/repro` N times back to back;
2. `--after-tests M`: M times, the torchrun tests (`RUN_SLOW=1 pytest tests/workbench/test_distributed_resume.py -k
   EXPR`, as `make test` runs them: `OMP_NUM_THREADS=1`, `PYTHONPATH=utils`, `-p pytest_global_state`), then at once
   `utils/repro`;
3. `--tests K`: the torchrun tests K times.

Each run's output goes to a log in `--log-dir` (default: a new temporary directory outside the repository); the logs
of passing runs are deleted unless `--keep-passing`. A run passes when it exits 0; a failing run is classified from
its output: `aborted` (a process aborted: `terminate called`, SIGABRT), `crashed` (a repro scenario whose process died,
a `crashed:` verdict), `traceback` (repro itself raised), `not_fixed` (repro ran, but the fork did not behave as fixed
in some scenario), `timeout`, `failed` (anything else). `--budget-minutes` stops starting new runs once that much wall
time has passed: the counts printed are those of the runs that ran. `--nice` lowers this script's priority (and its
children's) first, for machines shared with other work. Repro writes to `<log dir>/repro` (not `build/repro`) unless
REPRO_ARGS name an `--out`.

Exit status: 0 when every run passed, 1 otherwise, 2 on a usage error.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(REPO_ROOT, ".venv", "bin", "python")
TEST_FILE = os.path.join("tests", "workbench", "test_distributed_resume.py")
TORCHRUN_TESTS = "TrainerResumeFp16DistributedTest"  # the class whose tests launch torchrun
RUN_TIMEOUT = 1800  # seconds for one run of either kind


def classify(kind: str, returncode, output: str) -> str:
    """How a run ended: `passed`, or the kind of failure (see the module docstring)."""
    if returncode == "timeout":
        return "timeout"
    if returncode == 0:
        return "passed"
    if "terminate called" in output or "SIGABRT" in output:
        return "aborted"
    if kind == "repro":
        if re.search(r"^\S+\s+\S+\s*: crashed: ", output, re.MULTILINE):
            return "crashed"
        if "Traceback (most recent call last)" in output:
            return "traceback"
        if "fork behaves as fixed in every scenario: NO" in output:
            return "not_fixed"
    return "failed"


def failing_verdicts(output: str) -> list[str]:
    """The fork's verdict lines of a repro run that did not pass (to say which scenario failed)."""
    lines = output.split("=== verdicts", 1)[-1].splitlines()
    return [line.strip() for line in lines if re.match(r"\S+\s+fork\s*: ", line)]


def run_once(kind: str, command: list[str], env: dict, log_dir: str, number: int, keep_passing: bool) -> dict:
    log = os.path.join(log_dir, f"{number:03d}-{kind}.log")
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        f.write(f"$ {' '.join(command)}\n")
        f.flush()
        try:
            returncode = subprocess.run(
                command, cwd=REPO_ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT
            ).returncode
        except subprocess.TimeoutExpired:
            returncode = "timeout"
    seconds = time.monotonic() - start
    with open(log, encoding="utf-8", errors="replace") as f:
        output = f.read()
    outcome = classify(kind, returncode, output)
    record = {"number": number, "kind": kind, "returncode": returncode, "outcome": outcome, "seconds": seconds}
    if outcome == "passed" and not keep_passing:
        os.remove(log)
    else:
        record["log"] = log
    if kind == "repro" and outcome != "passed":
        record["fork_verdicts"] = failing_verdicts(output)
    if kind == "tests":
        record["failed_tests"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return record


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Run utils/repro and the torchrun workbench tests repeatedly and count the outcomes.",
        epilog="Arguments after `--` go to utils/repro.",
    )
    parser.add_argument("--repro", type=int, default=30, metavar="N", help="repro runs back to back (default: 30)")
    parser.add_argument(
        "--after-tests", type=int, default=0, metavar="M", help="repro runs each right after the torchrun tests"
    )
    parser.add_argument("--tests", type=int, default=0, metavar="K", help="runs of the torchrun tests alone")
    parser.add_argument(
        "-k", default=TORCHRUN_TESTS, help=f"pytest -k of the torchrun tests (default: {TORCHRUN_TESTS})"
    )
    parser.add_argument("--budget-minutes", type=float, help="start no run after this many minutes")
    parser.add_argument("--nice", type=int, default=19, help="niceness increment for this script (default: 19)")
    parser.add_argument("--log-dir", help="where the logs go (default: a new temporary directory)")
    parser.add_argument("--keep-passing", action="store_true", help="keep the logs of passing runs too")
    argv = sys.argv[1:] if argv is None else argv
    own, repro_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    options = parser.parse_args(own)
    if min(options.repro, options.after_tests, options.tests) < 0:
        parser.error("run counts must be >= 0")
    options.repro_args = repro_args
    return options


def main(argv=None) -> int:
    options = parse_args(argv)
    if options.nice:
        os.nice(options.nice)
    log_dir = os.path.abspath(options.log_dir or tempfile.mkdtemp(prefix="stress_repro_"))
    os.makedirs(log_dir, exist_ok=True)
    repro_args = options.repro_args
    if "--out" not in repro_args:
        repro_args = ["--out", os.path.join(log_dir, "repro"), *repro_args]
    repro = [PYTHON, os.path.join("utils", "repro"), *repro_args]
    tests = [PYTHON, "-m", "pytest", "-p", "pytest_global_state", "-p", "no:cacheprovider", "-q", "-rfEs", TEST_FILE]
    tests += ["-k", options.k]
    test_env = dict(os.environ, OMP_NUM_THREADS="1", RUN_SLOW="1")
    test_env["PYTHONPATH"] = os.pathsep.join(p for p in ("utils", os.environ.get("PYTHONPATH")) if p)
    plan = [("repro", ("repro",))] * options.repro + [("after-tests", ("tests", "repro"))] * options.after_tests
    plan += [("tests", ("tests",))] * options.tests
    print(f"stress_repro: {len(plan)} iterations; logs in {log_dir}", flush=True)
    start, records, number = time.monotonic(), [], 0
    for iteration, (phase, steps) in enumerate(plan, start=1):
        if options.budget_minutes is not None and time.monotonic() - start > 60 * options.budget_minutes:
            print(
                f"stress_repro: budget of {options.budget_minutes:g} min spent, {len(plan) - iteration + 1} "
                "iterations not started",
                flush=True,
            )
            break
        for kind in steps:
            number += 1
            command, env = (repro, dict(os.environ)) if kind == "repro" else (tests, test_env)
            record = run_once(kind, command, env, log_dir, number, options.keep_passing)
            record["phase"] = phase
            records.append(record)
            extra = f" ({record['log']})" if "log" in record else ""
            print(
                f"[{iteration}/{len(plan)}] {phase:11s} {kind:5s} {record['outcome']:9s} {record['seconds']:6.0f} s"
                f"{extra}",
                flush=True,
            )
            for line in record.get("fork_verdicts", []) + record.get("failed_tests", []):
                print(f"      {line}", flush=True)
    summary = summarize(records)
    with open(os.path.join(log_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"argv": sys.argv, "summary": summary, "runs": records}, f, indent=2)
    print(f"\nstress_repro: {time.monotonic() - start:.0f} s; logs and summary.json in {log_dir}")
    for key, counts in summary.items():
        outcomes = ", ".join(f"{outcome} {count}" for outcome, count in sorted(counts.items()) if outcome != "runs")
        print(f"  {key:17s}: {counts.get('passed', 0)}/{counts['runs']} passed ({outcomes})")
    return 0 if all(record["outcome"] == "passed" for record in records) else 1


def summarize(records: list[dict]) -> dict:
    """`{"phase/kind": {"runs": n, outcome: count}}` in the order the runs came."""
    summary = {}
    for record in records:
        counts = summary.setdefault(f"{record['phase']}/{record['kind']}", {"runs": 0})
        counts["runs"] += 1
        counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
    return summary


if __name__ == "__main__":
    sys.exit(main())
