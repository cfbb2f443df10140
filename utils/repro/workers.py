"""
The worker processes, one per variant: what each runs (its single-process scenarios, then the torchrun launch), and
the driver's side: the stock sources, starting the workers in parallel, and reading their results (a failed worker's
lost runs become crashed runs).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .launch import OutputTail, failed_run, last_error_line, launch_ddp_runs, signal_name, worker_command
from .runs import copy_checkpoint, run_one, start_worker_process
from .scenarios import DDP_SCENARIOS, OPTIM, REPO_ROOT, RESUME_SCENARIOS, SCENARIOS


# accelerate is a second upstream of the workbench: stock means stock accelerate too (the default stock directory
# holds both pristine source trees).
DEFAULT_STOCK_SRC = os.path.join("build", "stock", "src")
WORKER_STOP_TIMEOUT = 30  # seconds a worker has to stop after SIGINT before it is killed


# What each worker records of the packages it imported (report.json's "variants", the console's version lines).
VERSION_KEYS = ("transformers_file", "transformers_version", "accelerate_file", "accelerate_version", "torch_version")


def fail(message: str):
    """Exits with status 2 (usage or setup error), printing `message` without a traceback."""
    print(f"repro: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def tree_version(src: str, module: str) -> str | None:
    """The `__version__` that `<src>/<module>/__init__.py` sets (None when there is none)."""
    try:
        with open(os.path.join(src, module, "__init__.py"), encoding="utf-8") as f:
            found = re.search(r"^__version__ = [\"']([^\"']+)[\"']", f.read(), re.MULTILINE)
    except OSError:
        return None
    return found.group(1) if found else None


def ensure_stock_src(stock_src: str) -> dict:
    """
    Checks that `stock_src` holds the pinned releases of transformers and accelerate (patches/config.json), and
    returns `{module: version}`. The default directory is made, or remade for other pins, by the workbench (what `make
    fork` does: `build/stock/src`, from the pinned sdists); another directory of other versions is refused.
    """
    from workbench.gitutil import ForkError
    from workbench.project import load_project
    from workbench.sources import build_stock, stock_dir

    try:
        project = load_project(Path(REPO_ROOT))
        if os.path.normpath(stock_src) == os.path.normpath(stock_dir(project)):
            build_stock(project, stock_dir(project))
    except ForkError as error:
        fail(f"cannot make the stock sources {stock_src}: {error}")
    pinned = {upstream.module: upstream.version for upstream in project.upstreams.values()}
    found = {module: tree_version(stock_src, module) for module in pinned}
    wrong = [f"{module} {found[module] or '(none)'}" for module in pinned if found[module] != pinned[module]]
    if wrong:
        fail(
            f"--stock-src {stock_src} holds {', '.join(wrong)}, not the pinned "
            + ", ".join(f"{module} {version}" for module, version in pinned.items())
            + " (the default build/stock/src is made from the pins)"
        )
    return found


def run_worker(variant: str, options) -> dict:
    """Runs the chosen scenarios with the `transformers` this process imports. Writes and returns the results."""
    import accelerate
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
        "accelerate_file": accelerate.__file__,
        "accelerate_version": accelerate.__version__,
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
    included) the workers are stopped (SIGINT, then killed after `WORKER_STOP_TIMEOUT`): no worker outlives this call.
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
            for package in ("transformers", "accelerate"):
                imported = results[variant].get(f"{package}_file")
                if imported is not None:
                    is_stock = os.path.abspath(imported).startswith(options.stock_src + os.sep)
                    if (variant == "stock") != is_stock:
                        fail(f"the {variant} worker imported {imported}")
        return results
    finally:
        for process in processes.values():  # a worker stopped by SIGINT (also Ctrl-C's) stops its torchrun first
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in processes.values():
            try:
                process.wait(timeout=WORKER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
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
    for key in VERSION_KEYS + ("device",):
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
