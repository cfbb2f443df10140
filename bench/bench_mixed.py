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
What the PRs' six test files add to a `pytest -n 2` run of upstream's `tests/trainer`, measured in one run.

Upstream's test files are not in the sdist: `--upstream DIR` is a scratch reconstruction of upstream's tree outside
this repository (its root `conftest.py`, `tests/__init__.py`, `tests/trainer/`...). The script copies it into a
temporary work tree, copies the six PR test files (`FILES`, from this checkout) to their upstream paths there, and
runs from the work tree's root, so that `run_test_using_subprocess`'s `python -m pytest <node id>` resolves:

- A: `pytest -n 2 -p no:cacheprovider -q <upstream's test files>`;
- B: the same command plus the six files.

A and B alternate repeat by repeat (A B A B ...), with `OMP_NUM_THREADS=1`, `HF_HUB_OFFLINE=1`,
`TRANSFORMERS_OFFLINE=1`, without `RUN_SLOW` (upstream's per-PR CI), against the fork (`PYTHONPATH=<fork>/src`).
Each run's CPU time is user + system of the pytest process tree (`resource.getrusage(RUSAGE_CHILDREN)` deltas: the
xdist workers and the fresh test processes they wait for); its outcomes come from `--junitxml`. With
`--per-file-repeats N` (default 1) it then runs each of the six files alone under `pytest -n 2`, and a floor: the
same command selecting no test (`-k`), xdist's two workers starting and collecting one file.

Reports per variant the median wall and CPU time, B - A (medians), and whether upstream's tests had the same outcome in
every run of A and B. Differences and ratios within this run only; nothing here asserts a time.

Usage:

```bash
python bench/bench_mixed.py --upstream /tmp/upstream-trainer-tests [--repeats 3] [--per-file-repeats 1] \
    [--fork build/transformers] [--out results.json]
```

Prints a table to stderr and JSON to stdout; exits 1 if upstream's outcomes differ between runs.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "utils"))
from upstream_pins import stack_tests  # noqa: E402
from workbench.junit_report import test_cases  # noqa: E402


FILES = tuple(stack_tests())  # the tests of the stack's transformers PRs
NO_TEST = "this_selects_no_test_at_all"


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def outcomes(junit_xml):
    """`{node id: outcome}` from a pytest junit XML report; a test that fails in its teardown after passing keeps
    its worst outcome."""
    result = {}
    for case in test_cases(junit_xml):
        name = case["test"] if not case["file"] else f"{case['file']}::{case['test']}"
        if result.get(name, "passed") == "passed":
            result[name] = case["outcome"]
    return result


def run_pytest(paths, cwd, env, report_dir, label, extra=()):
    junit = report_dir / f"{label}.xml"
    command = [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}"]
    command += [*extra, *paths]
    cpu, start = children_cpu_seconds(), time.monotonic()
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.monotonic() - start, children_cpu_seconds() - cpu
    lines = run.stdout.strip().splitlines()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "returncode": run.returncode,
        "summary": lines[-1] if lines else run.stderr[-300:],
        "outcomes": outcomes(junit),
        "load_average_before": None,
    }


def counts(run_outcomes):
    return dict(sorted(Counter(run_outcomes.values()).items()))


def is_ours(node_id):
    ours = {Path(path).stem for path in FILES}
    return any(part in ours for part in node_id.replace("/", ".").replace("::", ".").split("."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path, required=True, help="scratch reconstruction of upstream's tree")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-file-repeats", type=int, default=1, help="0 to skip the per-file runs")
    parser.add_argument("--fork", type=Path, default=ROOT / "build" / "transformers")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    if not (args.upstream / "conftest.py").is_file() or not (args.upstream / "tests" / "trainer").is_dir():
        sys.exit(f"--upstream {args.upstream}: no conftest.py and tests/trainer/ there")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # The fork first; then what the caller's PYTHONPATH adds (e.g. `datasets`, which `test_trainer.py` imports)
        "PYTHONPATH": os.pathsep.join(filter(None, [str(args.fork.resolve() / "src"), os.environ.get("PYTHONPATH")])),
    }
    env.pop("RUN_SLOW", None)

    with tempfile.TemporaryDirectory(prefix="bench-mixed-") as scratch:
        work, reports = Path(scratch) / "tree", Path(scratch) / "reports"
        shutil.copytree(args.upstream, work, ignore=shutil.ignore_patterns("__pycache__"))
        reports.mkdir()
        upstream_files = sorted(str(p.relative_to(work)) for p in (work / "tests" / "trainer").glob("test_*.py"))
        upstream_files += sorted(
            str(p.relative_to(work))
            for p in (work / "tests" / "utils").glob("test_*.py")
            if (work / "tests" / "utils").is_dir()
        )
        (work / "tests" / "utils").mkdir(exist_ok=True)
        (work / "tests" / "utils" / "__init__.py").touch()
        for path in FILES:
            if (work / path).exists():
                sys.exit(f"{path} already in {args.upstream}: the upstream tree must not hold the PR files")
            shutil.copy2(ROOT / path, work / path)

        variants = {"A": upstream_files, "B": upstream_files + list(FILES)}
        runs = {"A": [], "B": []}
        for repeat in range(args.repeats):
            for name, paths in variants.items():
                load = os.getloadavg()[0]
                run = run_pytest(paths, work, env, reports, f"{name}{repeat}")
                run["load_average_before"] = load
                runs[name].append(run)
                print(
                    f"repeat {repeat + 1} {name}: wall {run['wall_s']:.1f} s, CPU {run['cpu_s']:.1f} s, "
                    f"load {load:.2f}, {run['summary']}",
                    file=sys.stderr,
                )

        per_file = {}
        if args.per_file_repeats > 0:
            for repeat in range(args.per_file_repeats):
                floor = run_pytest([upstream_files[0]], work, env, reports, f"floor{repeat}", extra=("-k", NO_TEST))
                per_file.setdefault("floor (no test selected)", []).append(floor)
                print(f"floor: wall {floor['wall_s']:.1f} s, CPU {floor['cpu_s']:.1f} s", file=sys.stderr)
                for path in FILES:
                    run = run_pytest([path], work, env, reports, f"{Path(path).stem}{repeat}")
                    per_file.setdefault(path, []).append(run)
                    print(
                        f"{path}: wall {run['wall_s']:.1f} s, CPU {run['cpu_s']:.1f} s, {run['summary']}",
                        file=sys.stderr,
                    )

    upstream_outcomes = [
        {node: outcome for node, outcome in run["outcomes"].items() if not is_ours(node)}
        for name in runs
        for run in runs[name]
    ]
    same_upstream = all(o == upstream_outcomes[0] for o in upstream_outcomes)
    ours_outcomes = [{n: o for n, o in run["outcomes"].items() if is_ours(n)} for run in runs["B"]]
    different = sorted(
        {node for o in upstream_outcomes for node in o if any(x.get(node) != o.get(node) for x in upstream_outcomes)}
    )

    def median(name, key):
        return statistics.median(run[key] for run in runs[name])

    result = {
        "upstream_files": upstream_files,
        "pr_files": list(FILES),
        "cores": os.cpu_count(),
        "median": {name: {"wall_s": median(name, "wall_s"), "cpu_s": median(name, "cpu_s")} for name in runs},
        "b_minus_a": {key: median("B", key) - median("A", key) for key in ("wall_s", "cpu_s")},
        "upstream_tests": len(upstream_outcomes[0]),
        "upstream_counts": counts(upstream_outcomes[0]),
        "upstream_outcomes_identical": same_upstream,
        "upstream_tests_differing": different,
        "ours_counts": [counts(o) for o in ours_outcomes],
        "runs": {name: [{k: v for k, v in run.items() if k != "outcomes"} for run in runs[name]] for name in runs},
        "upstream_outcomes": upstream_outcomes[0],
        "per_file": {
            path: {
                "wall_s": statistics.median(r["wall_s"] for r in rs),
                "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                "summary": rs[-1]["summary"],
            }
            for path, rs in per_file.items()
        },
        "load_average_after": os.getloadavg(),
    }
    print(
        "| variant | repeat | wall s | CPU s | load before | summary |\n|---|---|---:|---:|---:|---|", file=sys.stderr
    )
    for name in runs:
        for i, run in enumerate(runs[name], 1):
            print(
                f"| {name} | {i} | {run['wall_s']:.1f} | {run['cpu_s']:.1f} | {run['load_average_before']:.2f} "
                f"| {run['summary']} |",
                file=sys.stderr,
            )
        m = result["median"][name]
        print(f"| {name} | median | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | | |", file=sys.stderr)
    d = result["b_minus_a"]
    print(f"B - A: wall {d['wall_s']:+.1f} s, CPU {d['cpu_s']:+.1f} s", file=sys.stderr)
    print(
        f"upstream: {result['upstream_tests']} tests {result['upstream_counts']}, "
        f"identical in every run: {same_upstream}",
        file=sys.stderr,
    )
    for path, r in result["per_file"].items():
        print(f"alone: {path}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s ({r['summary']})", file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if not same_upstream:
        sys.exit(1)


if __name__ == "__main__":
    main()
