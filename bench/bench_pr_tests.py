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
CPU time (user + sys of pytest and all its children) of each PR's non-slow tests, against a baseline run in the same
repeat, as upstream's per-PR CI runs them: `pytest -n 2 -p no:cacheprovider -q`, `OMP_NUM_THREADS=1`,
`HF_HUB_OFFLINE=1`, no `RUN_SLOW`, in the fork of the PR's upstream (`build/transformers`, `build/accelerate`).

Each repeat runs, one after the other:

- per PR of `patches/stack.json`: its tests, then its baseline, the existing upstream test file where its tests belong
  (`belongs_in`) when that file is in the fork (accelerate's sdist has its tests; transformers' has none) or under
  `--upstream DIR` (a tree of upstream's test files reconstructed outside the repository, run from DIR's root with the
  fork first on `PYTHONPATH`); otherwise the same command with `-k` selecting no test: xdist's two workers starting
  and importing the PR's file, what every upstream test file pays under `-n 2` before its first test;
- all PRs' tests together: one `-n 2` run per upstream (the total is their sum);
- the `run_test_using_subprocess` PRs' tests serially (no `-n`): the decorator's own tests.

Prints a table of medians and the ratios PR / baseline to stderr, JSON to stdout; exits 1 if a run of PR tests fails.

```bash
python bench/bench_pr_tests.py [--repeats 3] [--upstream DIR] [--out results.json]
```
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "utils"))
from workbench.project import load_project  # noqa: E402
from workbench.stack import load_stack  # noqa: E402


PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
NO_TEST = ["-k", "no_test_has_this_name"]
DECORATOR_PRS = ("testing-run-test-using-subprocess-env", "testing-run-test-using-subprocess-skips")


def cpu_of(command, cwd, env):
    """User + sys seconds of `command` and every process it waited for, its wall seconds and its last output line."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-300:]
    return {"cpu_s": round(cpu, 2), "wall_s": round(time.monotonic() - start, 2), "rc": run.returncode, "last": last}


def runs_of(project, upstream_dir):
    """(name, command, cwd, env, is a baseline) of every run of one repeat."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("RUN_SLOW", None)
    forks = {name: upstream.fork_dir for name, upstream in project.upstreams.items()}
    stack = load_stack(project)
    runs = []
    for pr in stack:
        fork = forks[pr.upstream]
        runs.append((pr.name, PYTEST + ["-n", "2", *pr.tests], fork, env, False))
        if (fork / pr.belongs_in).is_file():
            baseline = (f"{pr.name}: baseline {pr.belongs_in}", PYTEST + ["-n", "2", pr.belongs_in], fork, env)
        elif upstream_dir is not None and (upstream_dir / pr.belongs_in).is_file():
            upstream_env = {**env, "PYTHONPATH": str(fork / "src")}
            baseline = (
                f"{pr.name}: baseline {pr.belongs_in}",
                PYTEST + ["-n", "2", pr.belongs_in],
                upstream_dir,
                upstream_env,
            )
        else:
            baseline = (f"{pr.name}: baseline, no test selected", PYTEST + ["-n", "2", *pr.tests, *NO_TEST], fork, env)
        runs.append((*baseline, True))
    for upstream, fork in forks.items():
        tests = [test for pr in stack if pr.upstream == upstream for test in pr.tests]
        if tests:
            runs.append((f"all {upstream} PRs", PYTEST + ["-n", "2", *tests], fork, env, False))
    decorator = [test for pr in stack if pr.name in DECORATOR_PRS for test in pr.tests]
    runs.append(("run_test_using_subprocess PRs, serial", PYTEST + decorator, forks["transformers"], env, False))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--upstream", type=Path, help="a tree of upstream's test files, outside the repository")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    project = load_project(ROOT)
    runs = runs_of(project, args.upstream)
    results = {name: [] for name, *_ in runs}
    for repeat in range(args.repeats):
        for name, command, cwd, env, is_baseline in runs:
            results[name].append(cpu_of(command, cwd, env))
            print(f"repeat {repeat + 1} {name}: {json.dumps(results[name][-1])}", file=sys.stderr)
            if not is_baseline and results[name][-1]["rc"] != 0:
                sys.exit(f"{name} failed: {results[name][-1]['last']}")

    median = {name: statistics.median(run["cpu_s"] for run in results[name]) for name in results}
    ratios = {}
    print("| run | CPU s, median | baseline CPU s | ratio |\n|---|---:|---:|---:|", file=sys.stderr)
    for name, _, _, _, is_baseline in runs:
        if is_baseline:
            continue
        baseline = next((other for other in median if other.startswith(f"{name}: baseline")), None)
        if baseline is not None:
            ratios[name] = median[name] / median[baseline]
        cells = f"{median[baseline]:.1f} ({baseline.split(': ', 1)[1]}) | {ratios[name]:.2f}" if baseline else "| "
        print(f"| {name} | {median[name]:.1f} | {cells} |", file=sys.stderr)
    total = sum(median[name] for name in median if name.startswith("all "))
    print(f"all PRs' non-slow tests under -n 2: {total:.1f} s CPU", file=sys.stderr)
    result = {
        "cores": os.cpu_count(),
        "load_average_after": os.getloadavg(),
        "commands": {name: " ".join(command[1:]) for name, command, *_ in runs},
        "runs": results,
        "median_cpu_s": median,
        "ratio_over_baseline": ratios,
        "all_prs_cpu_s": total,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
