"""The global-state guard's cost (utils/pytest_global_state.py): the same pytest run with and without the plugin,
alternating repeat by repeat, as CPU time of the run (pytest and its children) and wall time; the ratio of medians.

Two suites, written to a temporary folder:
- `trainer`: TESTS tests (default 30, about the number of `test_trainer_checkpointing.py`'s tests that run on CPU),
  each training a two-parameter regression model for two epochs with a `Trainer`, saving every 4 steps, and resuming
  from a checkpoint in a second `Trainer`;
- `trivial`: TRIVIAL empty tests in a process that imported transformers' `Trainer` (every module the guard compares
  is loaded): the guard's cost per test with nothing else to measure it against.

    .venv/bin/python bench/bench_guard.py [--repeats 3] [--tests 30] [--trivial 300] [--out FILE]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


UTILS = Path(__file__).resolve().parents[1] / "utils"

TRAINER_SUITE = """
import pytest
import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Line(torch.utils.data.Dataset):
    def __init__(self, length=64):
        self.x = torch.randn(length, 1, generator=torch.Generator().manual_seed(0))
        self.y = 2 * self.x + 3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_x": self.x[i], "labels": self.y[i]}


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(1))
        self.b = nn.Parameter(torch.zeros(1))

    def forward(self, input_x, labels=None):
        y = self.a * input_x + self.b
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


@pytest.mark.parametrize("run", range(TESTS))
def test_train_save_and_resume(tmp_path, run):
    args = TrainingArguments(
        tmp_path, per_device_train_batch_size=8, num_train_epochs=2, save_steps=4, logging_steps=4,
        report_to="none", use_cpu=True, disable_tqdm=True,
    )
    Trainer(Affine(), args, train_dataset=Line()).train()
    Trainer(Affine(), args, train_dataset=Line()).train(resume_from_checkpoint=str(tmp_path / "checkpoint-8"))
"""

TRIVIAL_SUITE = """
import pytest
from transformers import Trainer  # noqa: F401


@pytest.mark.parametrize("run", range(TESTS))
def test_nothing(run):
    pass
"""


def run(folder: Path, guarded: bool) -> tuple[float, float, str]:
    """(CPU seconds of pytest and its children, wall seconds, pytest's last line)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_suite.py"]
    if guarded:
        cmd[3:3] = ["-p", "pytest_global_state"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(UTILS), os.environ.get("PYTHONPATH", "")]))
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    out = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, check=False)
    wall, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    if out.returncode != 0:
        raise SystemExit(f"pytest failed ({'with' if guarded else 'without'} the guard): {out.stdout[-3000:]}")
    return cpu, wall, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tests", type=int, default=30, help="tests of the trainer suite")
    parser.add_argument("--trivial", type=int, default=300, help="tests of the trivial suite (0: skip it)")
    parser.add_argument("--out", type=Path, help="write the measurements as JSON")
    args = parser.parse_args()
    results = {}
    suites = {"trainer": (TRAINER_SUITE, args.tests), "trivial": (TRIVIAL_SUITE, args.trivial)}
    for name, (source, tests) in suites.items():
        if not tests:
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-guard-{name}-") as folder:
            Path(folder, "test_suite.py").write_text(source.replace("TESTS", str(tests)), encoding="utf-8")
            runs = {False: [], True: []}
            for repeat in range(args.repeats):
                for guarded in (False, True) if repeat % 2 == 0 else (True, False):
                    cpu, wall, last = run(Path(folder), guarded)
                    runs[guarded].append((cpu, wall))
                    print(f"{name} {'guarded' if guarded else 'plain  '} cpu {cpu:7.2f} s wall {wall:7.2f} s  {last}")
        median = {g: [statistics.median(x[i] for x in runs[g]) for i in (0, 1)] for g in runs}
        result = {
            "tests": tests,
            "runs": {"plain": runs[False], "guarded": runs[True]},
            "cpu ratio": median[True][0] / median[False][0],
            "wall ratio": median[True][1] / median[False][1],
            "cpu per test (ms)": 1000 * (median[True][0] - median[False][0]) / tests,
        }
        results[name] = result
        print(
            f"{name}: {tests} tests, median CPU guarded/plain {result['cpu ratio']:.3f}, wall {result['wall ratio']:.3f},"
            f" {result['cpu per test (ms)']:+.1f} ms CPU a test"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
