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
Per-test cost of ways of running the same test body, from one run.

With `--parity`: the fp16 resume parity test of `tests/trainer/test_trainer_resume_fp16.py` (a tiny GPT-2, one
uninterrupted fp16 Trainer run and three resumed ones), run through `unittest` alternately in process (warm: after a
first run in this process) and with `run_test_in_fresh_process` (its server started beforehand), both on one torch
thread as the test asks; the ratio of the medians is the cost of a fresh process for that test. With
`--forked-server`, the server is a copy of this process made when the test module is imported, as under pytest 8.2+;
without it, a new interpreter, as outside pytest.

Without it, four ways of running a small body:

- `in_process`: the body is called directly (the baseline);
- `fresh_process`: `transformers.testing_isolation.run_test_in_fresh_process`, server already started (its start-up,
  the first call, is reported on its own);
- `fresh_interpreter`: `python -c` importing torch and `transformers.trainer`, then running the body;
- `pytest_subprocess`: `python -m pytest <node id>` in a subprocess, as `testing_utils.run_test_using_subprocess` does.

Usage:

```bash
python bench/bench_isolation.py [--repeats 50] [--subprocess-repeats 3] [--trainer] [--out results.json]
python bench/bench_isolation.py --parity [--repeats 7] [--forked-server] [--out results.json]
```

Prints JSON to stdout and a table to stderr. Times are wall-clock seconds per test; `overhead` subtracts `in_process`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock


BODIES = """
import tempfile

import torch

import transformers.trainer  # every way of running pays for this import, like a test module of tests/trainer
from transformers import Trainer, TrainingArguments


def test_trivial():
    assert torch.ones(2).sum().item() == 2


class TinyRegression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        logits = self.linear(x)
        return {"loss": torch.nn.functional.mse_loss(logits, labels), "logits": logits}


def test_tiny_trainer():
    torch.manual_seed(0)
    dataset = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(20)]
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir, max_steps=5, per_device_train_batch_size=4, use_cpu=True, report_to="none",
            save_strategy="no", logging_strategy="no", disable_tqdm=True,
        )
        Trainer(TinyRegression(), args, train_dataset=dataset).train()
"""
MODULE = "bench_isolation_bodies"


def time_calls(call, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def measure(body_name, directory, repeats, subprocess_repeats):
    import importlib

    from transformers.testing_isolation import run_test_in_fresh_process

    body = getattr(importlib.import_module(MODULE), body_name)
    isolated = run_test_in_fresh_process(body)
    fresh_interpreter = [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {directory!r}); import torch, transformers.trainer; "
        f"from {MODULE} import {body_name}; {body_name}()",
    ]
    pytest_subprocess = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"{MODULE}.py::{body_name}"]
    # The environment `run_test_using_subprocess` gives its subprocess.
    pytest_environ = {**os.environ, "_INSIDE_SUB_PROCESS": "1", "CI": "true"}

    def run(command, **kwargs):
        subprocess.run(command, cwd=directory, check=True, capture_output=True, **kwargs)

    times = {"in_process": time_calls(body, repeats)}
    times["fresh_process"] = time_calls(isolated, repeats)
    times["fresh_interpreter"] = time_calls(lambda: run(fresh_interpreter), subprocess_repeats)
    times["pytest_subprocess"] = time_calls(lambda: run(pytest_subprocess, env=pytest_environ), subprocess_repeats)
    overheads = {mode: seconds - times["in_process"] for mode, seconds in times.items()}
    return {
        mode: {
            "seconds_per_test": seconds,
            "overhead_seconds": overheads[mode],
            # How many times faster than `run_test_using_subprocess`, in total time and in overhead.
            "speedup_vs_pytest_subprocess": times["pytest_subprocess"] / seconds,
            "overhead_speedup_vs_pytest_subprocess": (
                overheads["pytest_subprocess"] / overheads[mode] if mode != "in_process" else None
            ),
        }
        for mode, seconds in times.items()
    }


PARITY_TEST = "test_resume_matches_uninterrupted_run_0_adamw_torch"


def measure_parity(repeats, forked_server):
    """Times the parity test in process and in a fresh process, alternately; returns the JSON-able results."""
    import torch

    import transformers.testing_isolation as isolation

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "trainer"))
    # Under pytest 8.2+ (`PYTEST_VERSION`), importing the test module makes the server: a copy of this process.
    with mock.patch.dict(os.environ, {"PYTEST_VERSION": "bench"} if forked_server else {}):
        from test_trainer_resume_fp16 import TrainerResumeFp16ParityTest

    torch.set_num_threads(1)  # what the test's `run_test_in_fresh_process(num_threads=1)` gives its child

    def run(in_process):
        isolation._in_fresh_process = in_process  # in process, the decorator calls the test directly
        result = unittest.TestResult()
        start = time.perf_counter()
        try:
            unittest.TestSuite([TrainerResumeFp16ParityTest(PARITY_TEST)]).run(result)
        finally:
            isolation._in_fresh_process = False
        assert result.wasSuccessful() and result.testsRun == 1, result.errors + result.failures
        return time.perf_counter() - start

    start = time.perf_counter()
    first = {"fresh_process": run(False)}  # includes the server start-up
    first["server_startup_and_first_test_seconds"] = time.perf_counter() - start
    first["server"] = "copy of this process" if isolation._server.forked else "new interpreter"
    first["in_process"] = run(True)  # cold: the first Trainer runs of this process
    times = {"in_process": [], "fresh_process": []}
    for _ in range(repeats):
        times["in_process"].append(run(True))
        times["fresh_process"].append(run(False))
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    return {
        "test": f"TrainerResumeFp16ParityTest.{PARITY_TEST}",
        "repeats": repeats,
        "first_runs_seconds": first,
        "seconds": times,
        "median_seconds": medians,
        "ratio_fresh_to_in_process": medians["fresh_process"] / medians["in_process"],
    }


def print_table(results):
    print(f"fresh_process server start-up (first call): {results['server_startup_seconds']:.2f} s", file=sys.stderr)
    header = (
        f"{'body':<18} {'mode':<18} {'s/test':>9} {'overhead s':>11} {'speedup vs (d)':>15} {'overhead speedup':>17}"
    )
    print(header, file=sys.stderr)
    for body_name, modes in results["bodies"].items():
        for mode, row in modes.items():
            overhead_speedup = row["overhead_speedup_vs_pytest_subprocess"]
            overhead_speedup = "-" if overhead_speedup is None else f"{overhead_speedup:.1f}x"
            print(
                f"{body_name:<18} {mode:<18} {row['seconds_per_test']:>9.4f} {row['overhead_seconds']:>11.4f} "
                f"{row['speedup_vs_pytest_subprocess']:>14.1f}x {overhead_speedup:>17}",
                file=sys.stderr,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50, help="Calls timed in process and in fresh processes.")
    parser.add_argument("--subprocess-repeats", type=int, default=3, help="Calls timed for the two subprocess modes.")
    parser.add_argument("--trainer", action="store_true", help="Also time a 5-step Trainer run on a tiny model.")
    parser.add_argument("--parity", action="store_true", help="Time the fp16 parity test instead (see above).")
    parser.add_argument(
        "--forked-server",
        action="store_true",
        help="With --parity: the server is a copy of this process, as under pytest 8.2+ (else a new interpreter).",
    )
    parser.add_argument("--out", help="Also write the JSON results to this file.")
    args = parser.parse_args()

    if args.parity:
        results = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "cpu_count": os.cpu_count()}
        results["load_average_before"] = os.getloadavg()
        results["parity"] = measure_parity(args.repeats if args.repeats != 50 else 7, args.forked_server)
        results["load_average_after"] = os.getloadavg()
        print(json.dumps(results, indent=2))
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=2)
        parity = results["parity"]
        print(
            f"parity test: in process {parity['median_seconds']['in_process']:.3f} s, fresh process "
            f"{parity['median_seconds']['fresh_process']:.3f} s (medians of {parity['repeats']}), ratio "
            f"{parity['ratio_fresh_to_in_process']:.3f}; server: {parity['first_runs_seconds']['server']}",
            file=sys.stderr,
        )
        return

    with tempfile.TemporaryDirectory(prefix="bench_isolation_") as directory:
        with open(os.path.join(directory, f"{MODULE}.py"), "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(BODIES))
        sys.path.insert(0, directory)

        from transformers.testing_isolation import run_test_in_fresh_process

        start = time.perf_counter()
        run_test_in_fresh_process(__import__(MODULE).test_trivial)()
        results = {
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "cpu_count": os.cpu_count(),
            "load_average_before": os.getloadavg(),
            "server_startup_seconds": time.perf_counter() - start,
            "bodies": {},
        }
        for body_name in ["test_trivial"] + (["test_tiny_trainer"] if args.trainer else []):
            results["bodies"][body_name] = measure(body_name, directory, args.repeats, args.subprocess_repeats)
        results["load_average_after"] = os.getloadavg()

    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    print_table(results)


if __name__ == "__main__":  # children import a script from its file, without running this block
    main()
