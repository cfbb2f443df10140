#!/usr/bin/env python3
"""
`make test`'s stages, one after the other, each announced as `[k/n] what`, its output shown as it comes; then a
one-screen summary: each stage ok or FAILED, its time and its counts (pytest's closing line; for the stack check, its
level runs and problems). Every stage runs even when an earlier one failed (one CI run reports them all); the exit
status is 1 when any failed (make makes it 2), 130 on Ctrl-C.

    .venv/bin/python utils/testrun.py [--pytest-args="-n auto"] [--only K ...]
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

from workbench.args import Parser
from workbench.testenv import pytest_options, sigint_ignored


UTILS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(UTILS)
# pytest's closing line: `3 failed, 120 passed, 4 skipped in 12.34s` (between `=` rules unless -q)
CLOSING = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s\b", re.MULTILINE)


def stages(pytest_args: str) -> list[tuple[str, list[str], dict]]:
    """(what, command, extra environment) of each stage, as the Makefile's test target ran them."""
    python, pytest = sys.executable, shlex.split(pytest_args)
    return [
        (
            "the stack: each PR applies, is exported and described, its tests pass at its level and fail without its fix",
            [python, os.path.join(UTILS, "fork.py"), "check", "--tests", f"--pytest-args={pytest_args}"],
            {},
        ),
        (
            "every test with the global-state plugin",
            [python, "-m", "workbench.testenv", "-p", "pytest_global_state", *pytest, "tests"],
            {"PYTHONPATH": UTILS},
        ),
        ("the PRs' tests under upstream's pytest pins", [python, os.path.join(UTILS, "upstream_pins.py")], {}),
        (
            "the DeepSpeed fp16 resume test under upstream's deepspeed spec",
            [python, os.path.join(UTILS, "upstream_pins.py"), "--extra", "deepspeed"]
            + ["--venv", os.path.join("build", "upstream-pins-deepspeed"), "--", "-p", "no:cacheprovider"]
            + [
                "--timeout",
                "900",
                "-rs",
                "-k",
                "deepspeed",
                os.path.join("tests", "workbench", "test_distributed_resume.py"),
            ],
            {},
        ),
    ]


def counts(output: str, check: bool) -> str:
    """What a stage's output says it ran: pytest's last closing line, or the stack check's runs and problems."""
    if check:
        runs = len(re.findall(r"^== PR ", output, re.MULTILINE))
        problems = len(re.findall(r"^FAIL: ", output, re.MULTILINE))
        return f"{runs} PR test runs, {problems} problem{'s' * (problems != 1)}"
    closing = CLOSING.findall(output)
    return closing[-1].strip().rstrip(",") if closing else "no pytest summary"


def run_stage(command: list[str], env: dict) -> tuple[int, str]:
    """Runs `command`, copying its output (stdout and stderr) to this stdout as it comes. Its status and output."""
    sys.stdout.flush()
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C does not reach it: stopped below, its output (a traceback, a line) unshown
    )
    chunks = []
    try:
        while chunk := os.read(process.stdout.fileno(), 65536):
            os.write(sys.stdout.fileno(), chunk)
            chunks.append(chunk)
    except KeyboardInterrupt:
        with sigint_ignored():  # a second Ctrl-C would leave it running, out of reach
            os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C: `make check` removes its levels
            while os.read(process.stdout.fileno(), 65536):
                pass
            process.wait()
        raise
    return process.wait(), b"".join(chunks).decode(errors="replace")


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"


def main(argv=None) -> int:
    parser = Parser(description="make test: its stages, then a summary")
    parser.add_argument(
        "--pytest-args", default="", type=pytest_options, help="pytest arguments of the stages, e.g. '-n auto'"
    )
    parser.add_argument(
        "--only", type=int, nargs="+", choices=range(1, len(stages("")) + 1), metavar="K", help="run only stages K"
    )
    args = parser.parse_args(argv)
    planned = stages(args.pytest_args)
    chosen = args.only or range(1, len(planned) + 1)
    results, start = [], time.monotonic()
    number = 0
    try:
        for number in chosen:
            what, command, env = planned[number - 1]
            print(f"\n[{number}/{len(planned)}] {what}", flush=True)
            began = time.monotonic()
            status, output = run_stage(command, env)
            results.append((number, what, status, time.monotonic() - began, counts(output, number == 1)))
    except KeyboardInterrupt:
        done = f"after {len(results)} finished stage{'s' * (len(results) != 1)}" if results else "in its first stage"
        print(
            f"\nmake test: interrupted {done} (at [{number}/{len(planned)}]); nothing is left to clean up: run "
            "`make test` again.",
            file=sys.stderr,
            flush=True,
        )
        return 130
    failed = [number for number, _, status, _, _ in results if status != 0]
    print(f"\n== make test: summary ({len(results)} of {len(planned)} stages, {minutes(time.monotonic() - start)})")
    for number, what, status, seconds, found in results:
        outcome = "ok" if status == 0 else f"FAILED (exit status {status})"
        print(f"[{number}/{len(planned)}] {outcome:8s} {minutes(seconds):>7s}  {what}\n{'':19s}{found}")
    if failed:
        print(f"make test: FAILED: stage{'s' * (len(failed) > 1)} {', '.join(map(str, failed))} (output above)")
        return 1
    print("make test: every stage ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
