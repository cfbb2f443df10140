# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""
Wall time of the project's tests/trainer files as upstream's CI would run them for a PR: `pytest -n 2` (one worker per
core of a 2-core machine), `OMP_NUM_THREADS=1`, without the `@slow` tests.

Each repeat runs, back to back:

- the reference, `python -c "import transformers.trainer"`: what every pytest worker and every fresh test process pays
  before anything else. Its time says how fast the machine was during that repeat (a shared machine varies by a third
  from one minute to the next), so that repeats and runs can be compared;
- the suite, `pytest -n 2 -q -p no:cacheprovider <files>` in the fork, with the CPU time the whole machine spent
  meanwhile (from `/proc/stat`: the suite is CPU-bound when wall × cores is close to it).

With `--baseline DIR` (another checkout of the fork, e.g. one built from an earlier commit of this repository), each
repeat also runs the same files from `DIR` (with `PYTHONPATH=DIR/src`, so that its own transformers is imported),
alternating with the suite, and the result gives the ratio of the medians: suite / baseline.

Usage:

```bash
python bench/bench_suite.py [--repeats 5] [--fork build/transformers] [--baseline DIR] [--out results.json] \
    [-- pytest args]
```

Prints JSON to stdout and a table to stderr; exits 1 if a run of the suite fails.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "utils"))
from upstream_pins import stack_tests  # noqa: E402


FILES = tuple(stack_tests())  # the tests of the stack's transformers PRs


def machine_cpu_seconds():
    """User + nice + system time of all CPUs since boot, from `/proc/stat`."""
    with open("/proc/stat", encoding="utf-8") as f:
        fields = f.readline().split()
    return sum(int(value) for value in fields[1:4]) / os.sysconf("SC_CLK_TCK")


def timed(command, cwd, env):
    cpu, start = machine_cpu_seconds(), time.monotonic()
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return time.monotonic() - start, machine_cpu_seconds() - cpu, run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fork", type=Path, default=ROOT / "build" / "transformers")
    parser.add_argument("--baseline", type=Path, help="another checkout of the fork to compare with")
    parser.add_argument("--out", type=Path)
    parser.add_argument("pytest_args", nargs="*", help="instead of `-n 2` and the project's files")
    args = parser.parse_args()

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RUN_SLOW", None)
    suite = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        *(args.pytest_args or ["-n", "2", *FILES]),
    ]
    reference = [sys.executable, "-c", "import transformers.trainer"]
    checkouts = {"suite": (args.fork, env)}
    if args.baseline is not None:
        if not (args.baseline / "src" / "transformers").is_dir():
            sys.exit(f"--baseline {args.baseline}: not a checkout of the transformers fork (no src/transformers)")
        checkouts["baseline"] = (args.baseline, {**env, "PYTHONPATH": str(args.baseline.resolve() / "src")})
    runs = {name: [] for name in checkouts}
    for repeat in range(args.repeats):
        for name, (cwd, run_env) in checkouts.items():
            reference_wall, _, _ = timed(reference, cwd, run_env)
            wall, cpu, run = timed(suite, cwd, run_env)
            summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-500:]
            runs[name].append(
                {"reference_s": reference_wall, "wall_s": wall, "machine_cpu_s": cpu, "summary": summary}
            )
            print(f"repeat {repeat + 1} {name}: {json.dumps(runs[name][-1])}", file=sys.stderr)
            if run.returncode != 0:
                print(run.stdout[-3000:] + run.stderr[-3000:], file=sys.stderr)
                sys.exit(1)

    keys = ("reference_s", "wall_s", "machine_cpu_s")
    medians = {name: {key: statistics.median(run[key] for run in runs[name]) for key in keys} for name in runs}
    result = {
        "command": " ".join(suite[1:]),
        "cores": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "runs": runs,
        "median": medians,
    }
    if "baseline" in medians:
        result["wall_ratio_suite_over_baseline"] = medians["suite"]["wall_s"] / medians["baseline"]["wall_s"]
    print("| checkout | repeat | reference s | wall s | machine CPU s |\n|---|---|---:|---:|---:|", file=sys.stderr)
    for name in runs:
        rows = [(str(i), run) for i, run in enumerate(runs[name], 1)] + [("median", medians[name])]
        for label, run in rows:
            print(
                f"| {name} | {label} | {run['reference_s']:.2f} | {run['wall_s']:.2f} | {run['machine_cpu_s']:.1f} |",
                file=sys.stderr,
            )
    if "baseline" in medians:
        print(f"wall ratio, suite / baseline: {result['wall_ratio_suite_over_baseline']:.2f}", file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
