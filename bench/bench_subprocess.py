"""Cost of running a test in a fresh process with `run_test_using_subprocess`, against the same body in process.

Every measurement is a whole `python -m pytest ...` run in the fork (`OMP_NUM_THREADS=1`, `-p no:cacheprovider`), with
its wall time and the CPU time of it and all its descendants (`RUSAGE_CHILDREN`, pytest waits for its workers and they
for their subprocesses). The in-process variant of a decorated test is the same command with `_INSIDE_SUB_PROCESS=1`,
which makes the decorator call the body directly. Variants alternate within each repeat; the result is the median per
variant and the ratio of medians isolated / in process:

- `trivial`: a decorated test whose body does nothing (the cost of a fresh process itself);
- `parity`: `test_resume_matches_uninterrupted_run` of `tests/trainer/test_trainer_resume_fp16.py`;
- `file -n 2`: the non-slow part of that file under `pytest -n 2` (what a PR's CI pays), and with `RUN_SLOW=1`;
- `file -n 2, no test selected`: the same command with `-k` matching no test (exit code 5): what pytest-xdist's two
  workers cost by themselves, importing torch and transformers to collect the file. `file -n 2` minus it is what the
  file's tests add.

    .venv/bin/python bench/bench_subprocess.py [--repeats 3] [--fork build/transformers] [--out FILE]
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


ROOT = Path(__file__).resolve().parent.parent
PARITY = "tests/trainer/test_trainer_resume_fp16.py"
TRIVIAL = """
import unittest

from transformers.testing_utils import run_test_using_subprocess


class Trivial(unittest.TestCase):
    @run_test_using_subprocess(deterministic=True)
    def test_trivial(self):
        pass
"""


def measure(cmd, cwd, env, ok=(0,)) -> dict:
    """Wall and CPU seconds (this command and its descendants) of one run; raises if its exit code is not in `ok`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        raise SystemExit(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fork", type=Path, default=ROOT / "build" / "transformers")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    fork = args.fork.resolve()
    if not (fork / PARITY).is_file():
        print(f"{fork / PARITY} does not exist: run `make fork` first", file=sys.stderr)
        return 2
    base_env = {k: v for k, v in os.environ.items() if k not in ("RUN_SLOW", "_INSIDE_SUB_PROCESS", "PYTEST_ADDOPTS")}
    base_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(fork / "src"))
    in_process = {**base_env, "_INSIDE_SUB_PROCESS": "1"}
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    parity_node = f"{PARITY}::TrainerResumeFp16Test::test_resume_matches_uninterrupted_run"
    with tempfile.TemporaryDirectory(prefix="bench-subprocess-") as tmp:
        (Path(tmp) / "test_trivial.py").write_text(TRIVIAL, encoding="utf-8")
        variants = {
            "trivial, in process": (pytest + ["test_trivial.py"], tmp, in_process),
            "trivial, fresh process": (pytest + ["test_trivial.py"], tmp, base_env),
            "parity, in process": (pytest + [parity_node], fork, in_process),
            "parity, fresh process": (pytest + [parity_node], fork, base_env),
            "file -n 2": (pytest + ["-n", "2", PARITY], fork, base_env),
            "file -n 2, RUN_SLOW=1": (pytest + ["-n", "2", PARITY], fork, {**base_env, "RUN_SLOW": "1"}),
            # pytest's exit code 5: no test selected
            "file -n 2, no test selected": (
                pytest + ["-n", "2", "-k", "no_such_test", PARITY],
                fork,
                base_env,
                (5,),
            ),
        }
        runs = {name: [] for name in variants}
        for repeat in range(args.repeats):
            names = list(variants) if repeat % 2 == 0 else list(reversed(variants))
            for name in names:
                runs[name].append(measure(*variants[name]))
                print(f"repeat {repeat + 1}: {name}: {runs[name][-1]}", file=sys.stderr)
    medians = {
        name: {key: statistics.median(r[key] for r in results) for key in ("wall_s", "cpu_s")}
        for name, results in runs.items()
    }
    ratios = {
        body: {
            key: round(medians[f"{body}, fresh process"][key] / medians[f"{body}, in process"][key], 2)
            for key in ("wall_s", "cpu_s")
        }
        for body in ("trivial", "parity")
    }
    floor = medians["file -n 2, no test selected"]
    added = {key: round(medians["file -n 2"][key] - floor[key], 2) for key in ("wall_s", "cpu_s")}
    result = {
        "repeats": args.repeats,
        "runs": runs,
        "medians": medians,
        "ratio_fresh_over_in_process": ratios,
        "file_-n_2_minus_no_test_selected": added,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
