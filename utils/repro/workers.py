"""
The worker processes, one per variant: what each runs (its single-process scenarios, then the torchrun launch), and
the driver's side: the stock sources, starting the workers in parallel, and reading their results (a failed worker's
lost runs become crashed runs).
"""

import json
import os
import shutil
import subprocess
import sys

from .launch import OutputTail, failed_run, last_error_line, launch_ddp_runs, signal_name, worker_command
from .runs import copy_checkpoint, run_one, start_worker_process
from .scenarios import DDP_SCENARIOS, OPTIM, REPO_ROOT, RESUME_SCENARIOS, SCENARIOS


FORK_DIR = os.path.join(REPO_ROOT, "build", "transformers")
# accelerate is a second upstream of the workbench: stock means stock accelerate too (the default stock directory
# holds both pristine source trees).
ACCELERATE_FORK_DIR = os.path.join(REPO_ROOT, "build", "accelerate")
DEFAULT_STOCK_SRC = os.path.join("build", "stock", "src")
STOCK_TAG = "upstream-base"


def fail(message: str):
    """Exits with status 2 (usage or setup error), printing `message` without a traceback."""
    print(f"repro: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def ensure_stock_src(stock_src: str) -> None:
    """Extracts the pristine sources (tag `upstream-base` of each fork) into `stock_src` when missing."""
    forks = {"transformers": FORK_DIR}
    if os.path.isdir(os.path.join(ACCELERATE_FORK_DIR, ".git")):
        forks["accelerate"] = ACCELERATE_FORK_DIR
    if all(os.path.isfile(os.path.join(stock_src, name, "__init__.py")) for name in forks):
        return
    if os.path.normpath(stock_src) != os.path.normpath(os.path.join(REPO_ROOT, DEFAULT_STOCK_SRC)):
        fail(f"--stock-src {stock_src} needs {' and '.join(f'{name}/__init__.py' for name in forks)}")
    print(f"extracting stock {' and '.join(forks)} ({STOCK_TAG} of the forks) into {stock_src} ...", flush=True)
    target = os.path.dirname(stock_src)
    partial = target + ".partial"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        for fork in forks.values():
            archive = subprocess.run(["git", "-C", fork, "archive", STOCK_TAG, "src"], capture_output=True)
            if archive.returncode != 0:
                fail(f"cannot extract {STOCK_TAG} from {fork}: {archive.stderr.decode(errors='replace').strip()}")
            untar = subprocess.run(["tar", "-x", "-C", partial], input=archive.stdout, capture_output=True)
            if untar.returncode != 0:
                fail(f"cannot unpack {STOCK_TAG} into {partial}: {untar.stderr.decode(errors='replace').strip()}")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(partial, target)
    except OSError as error:
        fail(f"cannot extract {STOCK_TAG} from {FORK_DIR} into {target}: {error}")


def run_worker(variant: str, options) -> dict:
    """Runs the chosen scenarios with the `transformers` this process imports. Writes and returns the results."""
    import torch

    import transformers

    capture = start_worker_process()
    device = options.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    base = os.path.join(options.out, variant)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    results = {
        "variant": variant,
        "transformers_file": transformers.__file__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": device,
        "runs": {},
    }
    common = {"options": options, "device": device, "capture": capture, "variant": variant}
    runs = _RecordedRuns(os.path.join(base, "worker.json"), results)
    if any(scenario in RESUME_SCENARIOS for scenario in options.scenarios):
        baseline = os.path.join(base, "uninterrupted")
        runs["uninterrupted"] = run_one("uninterrupted", baseline, precision="fp16", optim=OPTIM, **common)
        for scenario in RESUME_SCENARIOS:
            if scenario not in options.scenarios or runs["uninterrupted"]["status"] != "ok":
                continue
            run_dir = os.path.join(base, scenario)
            checkpoint = copy_checkpoint(baseline, options.resume_step, run_dir)
            if scenario == "no_scaler_pt":
                os.remove(os.path.join(checkpoint, "scaler.pt"))
            precision = "bf16" if scenario == "bf16_resume" else "fp16"
            runs[scenario] = run_one(
                scenario, run_dir, precision=precision, optim=OPTIM, resume_from=checkpoint, **common
            )
    if "fused_skip" in options.scenarios:
        for optim in ("adamw_torch", OPTIM):
            name = f"fused_skip/{optim}"
            run_dir = os.path.join(base, name)
            runs[name] = run_one(
                name,
                run_dir,
                precision="fp16",
                optim=optim,
                overflow_steps=options.overflow_steps,
                save=False,
                **common,
            )
    if any(scenario in DDP_SCENARIOS for scenario in options.scenarios):
        try:
            ddp_runs = launch_ddp_runs(variant, options, base)
        except Exception as error:  # e.g. torchrun cannot be started: that scenario's verdict, not the worker's end
            ddp_runs = {"ddp/uninterrupted": failed_run(f"the two-process run could not start ({error})")}
        for name, record in ddp_runs.items():
            runs[name] = record
    return results


class _RecordedRuns(dict):
    """
    The worker's run records: every new record is written at once to `path` (with the worker's other `results`), so
    that a worker that dies later still leaves the runs it finished, and the driver knows which ones it lost.
    """

    def __init__(self, path: str, results: dict):
        super().__init__()
        self.path, self.results = path, results
        results["runs"] = self
        self._write()

    def __setitem__(self, name, record):
        super().__setitem__(name, record)
        self._write()

    def _write(self):
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(self.results, f, indent=2)
        os.replace(partial, self.path)


def _worker_env(variant: str, options) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != options.stock_src]
    if variant == "stock":
        paths.insert(0, options.stock_src)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_workers(options) -> dict:
    """
    Runs one worker process per variant, in parallel. Returns `{variant: worker results}`. A worker that fails (exits
    with an error, is killed, or leaves no readable results) does not stop the others: the runs it did not finish
    become crashed runs saying why (its exit status or signal and its last error line), so that each of its scenarios
    gets that verdict. A worker that imported the wrong `transformers` is a setup error. On any exception (Ctrl-C
    included) the workers are killed: no worker outlives this call.
    """
    processes, outputs = {}, {}
    try:
        for variant in options.variants:
            processes[variant] = subprocess.Popen(
                worker_command(variant, options),
                env=_worker_env(variant, options),
                cwd=REPO_ROOT,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
            outputs[variant] = OutputTail(processes[variant].stderr, sys.stderr)
        results = {}
        for variant, process in processes.items():
            returncode = process.wait()
            outputs[variant].join(timeout=30)
            results[variant] = _read_worker_results(variant, options, returncode, outputs[variant].lines)
            transformers_file = results[variant]["transformers_file"]
            if transformers_file is not None:
                is_stock = os.path.abspath(transformers_file).startswith(options.stock_src + os.sep)
                if (variant == "stock") != is_stock:
                    fail(f"the {variant} worker imported {transformers_file}")
        return results
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        for output in outputs.values():
            output.join(timeout=30)


def _read_worker_results(variant: str, options, returncode: int, output_lines) -> dict:
    """
    Reads `<out>/<variant>/worker.json` (written by the worker after each run). When the worker failed, every run of
    the chosen scenarios it did not record becomes a crashed run with the reason.
    """
    path = os.path.join(options.out, variant, "worker.json")
    results, unreadable = None, None
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        if not isinstance(results, dict) or not isinstance(results.get("runs"), dict):
            raise ValueError("no 'runs'")
    except FileNotFoundError:
        results = None
    except (OSError, ValueError) as error:
        results, unreadable = None, f"{type(error).__name__}: {error}"
    if returncode == 0 and results is not None:
        return results
    if results is None:
        results = {"variant": variant, "runs": {}}
    for key in ("transformers_file", "transformers_version", "torch_version", "device"):
        results.setdefault(key, None)
    name = signal_name(returncode)
    why = f"the {variant} worker failed (exit status {returncode}{f', {name}' if name else ''})"
    if returncode == 0:
        why = f"the {variant} worker left no readable results"
    if unreadable:
        why += f"; {path} cannot be read ({unreadable})"
    last_error = last_error_line(output_lines)
    if last_error:
        why += f"; last error: {last_error}"
    print(f"repro: {why}", file=sys.stderr, flush=True)
    for scenario in options.scenarios:
        for run_name in SCENARIOS[scenario][1:3]:
            if run_name not in results["runs"]:
                results["runs"][run_name] = failed_run(why)
    return results
