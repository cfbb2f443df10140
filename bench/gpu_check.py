"""One-GPU check: CUDA fp16 resume parity (bit-exact), where determinism state leaks, and the fused-skip patch's cost.

    python3 bench/gpu_check.py --out DIR [--unpack CARRY] [--parts a,b] [--steps 300] [--repeats 2] [--timeout 360]
                               [--require-cuda]

Writes DIR/gpu_check.json and DIR/gpu_check.txt (each whole: temp file + os.replace) once the probe ran and again after
every part, so a kill or a crash keeps what finished. Each part runs guarded: an exception in it becomes its record
(status error, reason, traceback). Parts (`--parts`, default all, always run in this order):

- parity (a): PARITY_NODE (the accelerator variant of the fork's fp16 resume parity test), one pytest, RUN_SLOW=1, as
  upstream's CI runs it: none of CUBLAS_WORKSPACE_CONFIG, CUDA_LAUNCH_BLOCKING, _INSIDE_SUB_PROCESS preset (the
  test's `TrainingArguments(full_determinism=True)` sets them through `enable_full_determinism`, inside the fresh
  process of its `run_test_using_subprocess`). The junit XML gives the outcome, duration and failure message.
- parity_after_cublas (b): one pytest process (our `bench/gpu_check_tests/cublas_then_parity.py`) first runs fp16 and
  fp32 matmuls on CUDA without CUBLAS_WORKSPACE_CONFIG, then the parity test's method in that process
  (`_INSIDE_SUB_PROCESS=1`). Two outcomes are expected, and `outcome` says which one came:
  `cublas_config_error`: torch's cuBLAS-configuration RuntimeError ("... it uses CuBLAS and you have CUDA >= 10.2 ...",
  aten Context.cpp `alertCuBLASConfigNotDeterministic`, which reads the variable once per process, at the first cuBLAS
  GEMM), recorded with its type, message and where it was raised (`cublas_config_error`); torch 2.13.0 no longer has
  that check (its Context.h declares no such function), so this outcome needs an older torch. `measured`: the test ran,
  every `torch.testing.assert_close` bit-exact (`bit_exact`, `max_abs_diff` over `comparisons`). A difference, or any
  other error, fails the part; the warm-up must have passed first. Where the error came and time is left, the
  `warn_only_variant` runs the same with `enable_full_determinism(..., warn_only=True)` (the check warns instead), for a
  bit-exactness number in a used worker; informative, it does not change the part's status.
- deterministic_leak (c): our `bench/gpu_check_tests/deterministic_leak.py`, run twice: its first test calls
  transformers' `enable_full_determinism(42)` and restores nothing, its second calls `torch.histc` on CUDA (listed by
  torch's `use_deterministic_algorithms` docstring as raising in deterministic mode). Keys: `op`, and per mode in
  `modes` (`in_process`: expected to fail with "does not have a deterministic implementation";
  `run_test_using_subprocess`, the first test decorated with it: expected to pass) `first_test`, `second_test`,
  `second_test_message`, `expected_second_test`, `as_expected`, `state_after_first_test`, `tests`.
- fused_skip_cost: a ~2M-parameter MLP, `AdamW(fused=True)`, `Accelerator(mixed_precision="fp16")`; ms/step with and
  without injected overflows, stock against patched Accelerate (separate processes, alternated), the pooled ratio and
  one ratio per repeat (`ratios_per_repeat`, `ratio_min`, `ratio_max`), host-device synchronisations per step
  (`torch.cuda.set_sync_debug_mode("warn")`) in `optimizer.step()` and in reading `step_was_skipped`, and whether
  `step_was_skipped` saw the skipped updates (stock misses them). Refused before timing (`check_stock`) when the
  "stock" accelerate has the fused-skip patch (the fork itself, where the interpreter finds it: the stock sources are
  the carried archive, else `build/stock/src` that `make fork` leaves, else the interpreter's own), the patched one
  lacks it, their versions differ, or the patched one is not the version patches/config.json pins.

Each part has a `status` (passed/ok, failed, error, skipped, no_tests), `expected` and, unless it passed, a `reason`.
Exit 0 only when every part had its expected outcome: passed (ok), or skipped where --require-cuda is not given;
`--require-cuda` turns "no GPU" into an error of every part and fails a run where nothing ran on a GPU. Exit 2: bad
arguments. Each part has its own time limit (150, 150 and 120 s; the benchmark takes the rest of --timeout; `PARTS`)
and starts only when --timeout still holds its least time (60, 60, 40, 60 s) beside the least of every later part.
Every child gets HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE and HF_DATASETS_OFFLINE=1 (the device has no network). The
report records the device: nvidia-smi's name, driver and memory, torch's version, git commit and CUDA build, cuDNN,
pytest and parameterized, transformers and both accelerates (version and file).

The device run's `timeout_s`: measured here on CPU (2 shared cores) the script's own start (probes, no GPU) takes
about 10 s, and the parity test's CPU variant about 18 s in process (22 s with its imports). On the GPU each pytest
part also pays torch+transformers imports (twice for part (a): the test re-runs itself in a child; not measured on a
GPU); the part limits add up to 150 + 150 + 120 s plus the benchmark's share of --timeout. Run with the default
`--timeout 360` and `timeout_s=420` (the device allows at most 600 s per command and 15 minutes a session, the
machine's start included): the script then ends by itself, its files written, before the command is killed, and one
rerun of a single part (`--parts`) still fits.

On the borrowed GPU machine (own Python 3.12, CUDA torch, stock accelerate and transformers, no network, 64 MiB
carried): first `make fork` here (the carried archives come from build/, which it rebuilds from patches/), then prepare
(build/ is git-ignored: it travels only through `carry`; `stash create` takes uncommitted edits):

    mkdir -p build/gpu_carry; t=build/transformers; a=build/accelerate; c=build/gpu_carry
    rev=$(git -C $t stash create); git -C $t archive ${rev:-HEAD} src tests/trainer pyproject.toml | gzip >$c/transformers.tar.gz
    rev=$(git -C $a stash create); git -C $a archive ${rev:-HEAD} src | gzip >$c/accelerate.tar.gz
    git -C $a archive upstream-base src | gzip >$c/accelerate-stock.tar.gz  # else the preinstalled one, checked
    .venv/bin/python -m zipfile -c $c/parameterized.zip .venv/lib/python3.11/site-packages/parameterized
    # transformers 5.25.0 needs huggingface-hub>=2.4.0; the device image had 1.33.0 (2026-12-04: `import transformers`
    # failed there). The wheels of this venv's versions, for the device's Python 3.12:
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d $c huggingface_hub==2.4.0 \
        httpx2==2.16.2 httpcore2==2.16.2 click==8.5.1 hf-xet==1.8.0 regex==2026.11.19 anyio==4.16.0 h11==0.16.0 \
        idna truststore typing-extensions

and run `python3 bench/gpu_check.py --unpack build/gpu_carry --out $OUT --require-cuda` with carry=["build/gpu_carry"]
(about 17 MiB; bench/, the synthetic test files included, is tracked and travels with the working tree).
`--unpack` extracts the three archives (each optional) and every *.whl / *.zip there (parameterized, the
huggingface-hub wheels above, pytest and its dependencies if missing) into a temporary folder, which become the
default sources.
"""

import argparse
import datetime
import functools
import glob
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOCK_SRC = f"{REPO_ROOT}/build/stock/src"  # the pinned releases, pristine (`make fork` makes it)
sys.path.insert(0, os.path.join(REPO_ROOT, "utils"))
from workbench.args import Parser  # noqa: E402
from workbench.junit_report import test_cases  # noqa: E402


MARK = "GPU_CHECK_JSON:"
# The accelerator parity test, as a pytest node id relative to the transformers fork's root: the one place to change
# when the test moves. Part (a) runs this node; part (b) imports its file and class and runs its method.
PARITY_NODE = "tests/trainer/test_trainer_resume_fp16.py::TrainerResumeFp16Test::test_resume_matches_uninterrupted_run_on_accelerator"
# Every child runs offline: the device has no network, and a Hub call would wait until its timeout
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# A fragment of the RuntimeError of torch's cuBLAS-configuration check (aten Context.cpp,
# `alertCuBLASConfigNotDeterministic`; gone in newer torch, see the docstring)
CUBLAS_CONFIG_ERROR = "it uses CuBLAS and you have CUDA >= 10.2"
SYNTHETIC_TESTS = os.path.join(REPO_ROOT, "bench", "gpu_check_tests")
# Kept out of the synthetic tests' pytest: they start without the variables that full_determinism sets
DETERMINISM_ENV = ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "_INSIDE_SUB_PROCESS")
NO_DETERMINISTIC_IMPLEMENTATION = "does not have a deterministic implementation"
# Each part's own limit in seconds, and the least it needs: a part starts only when the total budget (--timeout) still
# holds that least for it and for every later part. The benchmark takes what is left.
PARTS = {
    "parity": (150, 60),
    "parity_after_cublas": (150, 60),
    "deterministic_leak": (120, 40),
    "fused_skip_cost": (None, 60),
}


def _under(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _parity_test(node=None):
    """The parity test's file, relative to the transformers root (from PARITY_NODE)."""
    return (node or PARITY_NODE).split("::")[0]


def _run(cmd, env, timeout, cwd=None):
    """Runs `cmd` in its own process group (killed as a whole on timeout), with OFFLINE_ENV added to `env` (default:
    this process's environment); returns (rc or None, output)."""
    env = {**(os.environ if env is None else env), **OFFLINE_ENV}
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out = proc.communicate(timeout=max(timeout, 1))[0]
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[0]


def _child(mode, cfg, pythonpath, timeout):
    """Runs this file in `--child MODE` with exactly `pythonpath`; returns its JSON (or an error record)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    rc, out = _run([sys.executable, os.path.abspath(__file__), "--child", mode, json.dumps(cfg)], env, timeout)
    lines = [line for line in out.splitlines() if line.startswith(MARK)]
    if rc is None:
        return {"status": "error", "reason": f"timed out after {timeout:.0f} s", "output_tail": out[-2000:]}
    if not lines:
        return {"status": "error", "reason": f"child exited {rc} without a result", "output_tail": out[-2000:]}
    return json.loads(lines[-1][len(MARK) :])


def _package(name, expect_under=None, expect_file=None):
    """Imports `name` (in a child) and checks where it came from; returns its record."""
    try:
        mod = __import__(name)
    except Exception as e:  # a broken fork must be reported, not crash the child
        return {"error": f"import {name} failed: {type(e).__name__}: {e}"}
    rec = {"file": mod.__file__, "version": getattr(mod, "__version__", None)}
    if (expect_under and not _under(mod.__file__, expect_under)) or (
        expect_file and os.path.realpath(mod.__file__) != os.path.realpath(expect_file)
    ):
        rec["error"] = f"{name} imported from {mod.__file__}, expected {expect_file or expect_under}"
    return rec


def child_probe(cfg):
    from importlib.util import find_spec

    out = {"python": platform.python_version(), "executable": sys.executable}
    if cfg.get("find_only"):  # where the interpreter finds the stock accelerate, without importing torch
        spec = find_spec("accelerate")
        return {**out, "accelerate": {"file": spec.origin} if spec else {"error": "accelerate not importable"}}
    import torch

    cuda = torch.cuda.is_available()
    out["torch"] = {
        "version": torch.__version__,
        "git_version": torch.version.git_version,
        "cuda_build": torch.version.cuda,
        "cuda_available": cuda,
    }
    if cuda:
        out["torch"].update(gpu=torch.cuda.get_device_name(0), cudnn=torch.backends.cudnn.version())
    out.update({name: _package(name, src) for name, src in cfg["expect"].items()})
    out["have"] = {name: find_spec(name) is not None for name in ("pytest", "parameterized")}
    out["versions"] = {}
    for name in ("pytest", "parameterized"):
        try:
            out["versions"][name] = __import__(name).__version__
        except Exception as e:  # missing, or broken: recorded, the parts that need it refuse to run
            out["versions"][name] = f"not importable: {type(e).__name__}: {e}"[:200]
    return out


def child_bench(cfg):
    import contextlib
    import warnings

    import torch

    out = {"accelerate": _package("accelerate", cfg.get("expect_under"), cfg.get("expect_file"))}
    if "error" in out["accelerate"]:
        return {**out, "status": "error", "reason": out["accelerate"]["error"]}
    if not torch.cuda.is_available():
        return {**out, "status": "skipped", "reason": "torch.cuda.is_available() is False in the child"}
    from accelerate import Accelerator

    torch.manual_seed(0)
    dims = (512, 1024, 1024, 512)  # 2.1M parameters
    layers = [torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
    model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
    acc = Accelerator(mixed_precision="fp16")
    model, opt = acc.prepare(model.to(acc.device), torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    x, y = torch.randn(64, 512, device=acc.device), torch.randn(64, 512, device=acc.device)
    first, counts = layers[0].weight, None

    @contextlib.contextmanager
    def phase(name):  # counts the synchronising CUDA calls of one phase, in the counting pass only
        if counts is None:
            yield
            return
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            yield
        counts[name] = counts.get(name, 0) + sum("synchroniz" in str(w.message) for w in record)

    def step(inject):
        with phase("forward_backward"):
            acc.backward(torch.nn.functional.mse_loss(model(x).float(), y))
            if inject:
                first.grad.view(-1)[0] = float("inf")
        with phase("optimizer_step"):
            opt.step()
        with phase("step_was_skipped"):
            skipped = opt.step_was_skipped
        with phase("zero_grad"):
            opt.zero_grad(set_to_none=True)
        return skipped

    res = {"status": "ok", "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "scenarios": {}}
    # A scale growth every 3 updates balances a halving every 4th (injected overflow); without overflows no growth
    # (hence no natural overflow) in the run. The scale restarts at 2**10 before each phase.
    for name, every, growth in (("no_overflow", 0, 10**6), ("overflow_every_4", 4, 3)):
        acc.scaler.set_growth_interval(growth)
        inject = [bool(every) and i % every == every - 1 for i in range(max(cfg["steps"], 30))]
        for i in range(30):
            step(inject[i])
        acc.scaler.update(new_scale=2.0**10)
        counts = {}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(16):
                step(inject[i])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs, counts, truth, reported = {k: v / 16 for k, v in counts.items()}, None, [], []
        acc.scaler.update(new_scale=2.0**10)
        for i in range(16):
            before = first.detach().clone()
            reported.append(bool(step(inject[i])))
            truth.append(torch.equal(first.detach(), before))
        wall, gpu = [], []
        for _ in range(3):
            acc.scaler.update(new_scale=2.0**10)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            for i in range(cfg["steps"]):
                step(inject[i])
            end.record()
            torch.cuda.synchronize()
            wall.append(round((time.perf_counter() - t0) * 1e3 / cfg["steps"], 4))
            gpu.append(round(start.elapsed_time(end) / cfg["steps"], 4))
        res["scenarios"][name] = {
            "ms_per_step_cuda_events": gpu,
            "ms_per_step_wall": wall,
            "syncs_per_step": syncs,
            "skips": {"steps": 16, "injected": sum(inject[:16]), "truly_skipped": sum(truth)},
            "reported_skipped": sum(reported),
            "reported_matches_truth": reported == truth,
        }
    return {**out, **res}


def _version_of(module_file):
    init = os.path.join(os.path.dirname(module_file), "__init__.py")
    with open(init, encoding="utf-8") as f:
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", f.read(), re.MULTILINE)
    return m.group(1) if m else None


def _patched(module_file):  # the fused-skip patch keeps the scaler's `found_inf` in `_found_inf`
    with open(os.path.join(os.path.dirname(module_file), "optimizer.py"), encoding="utf-8") as f:
        return "_found_inf" in f.read()


def _pytest(args, env, timeout, cwd, tmp):
    """Runs `python -m pytest ARGS` in `cwd`, its junit XML written into the folder `tmp`. Returns (result, tests):
    result with pytest_rc, wall_s and output_tail (status error on a timeout), and the junit test cases in the order
    they ran."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", f"--junitxml={tmp}/junit.xml", *args]
    start = time.perf_counter()
    rc, out = _run(cmd, env, timeout, cwd=cwd)
    res = {"pytest_rc": rc, "wall_s": round(time.perf_counter() - start, 1), "output_tail": out[-3000:]}
    if rc is None:
        res.update(status="error", reason=f"pytest timed out after {timeout:.0f} s")
    return res, test_cases(f"{tmp}/junit.xml")


def run_parity(root, pythonpath, timeout):
    """Part (a): PARITY_NODE in a fresh pytest, as upstream's CI runs it: RUN_SLOW=1 and none of DETERMINISM_ENV
    preset (the test's `full_determinism` sets them inside its own child, through `enable_full_determinism`)."""
    test = _parity_test()
    if not os.path.isfile(os.path.join(root, test)):
        return {"status": "no_tests", "reason": f"{test} not found under {root}"}
    env = {k: v for k, v in os.environ.items() if k not in DETERMINISM_ENV}
    env.update(PYTHONPATH=os.pathsep.join(pythonpath), RUN_SLOW="1")
    with tempfile.TemporaryDirectory(prefix="gpu_check_junit_", ignore_cleanup_errors=True) as tmp:
        res, tests = _pytest([PARITY_NODE], env, timeout, root, tmp)
    res.update(node=PARITY_NODE, preset=dict.fromkeys(DETERMINISM_ENV))
    rc = res["pytest_rc"]
    outcomes = {t["outcome"] for t in tests}
    if rc is None:
        pass  # timed out: already an error
    elif outcomes & {"failed", "error"} or rc not in (0, 5):
        res.update(status="failed", reason=f"pytest exited {rc}")
    elif not tests or rc == 5:
        res.update(status="no_tests", reason=f"{PARITY_NODE} was not collected")
    elif outcomes == {"skipped"}:
        res.update(status="skipped", reason="; ".join(sorted({t["message"] for t in tests})))
    else:
        res["status"] = "passed"
    return {**res, "tests": tests}


def run_synthetic(name, pythonpath, timeout, env=None, pytest_args=()):
    """Runs our own test file `bench/gpu_check_tests/NAME.py` with pytest, as `test_NAME.py` in a temporary folder
    (with an empty pytest.ini: no configuration found above it), with PYTHONPATH `pythonpath`, none of
    DETERMINISM_ENV, `env` added and GPU_CHECK_RECORD naming the JSON file the tests write. Returns (result, tests,
    record): result with pytest_rc, wall_s and output_tail (status error on a timeout), the junit test cases in the
    order they ran, and the record ({} when no test wrote one)."""
    with tempfile.TemporaryDirectory(prefix=f"gpu_check_{name}_", ignore_cleanup_errors=True) as tmp:
        shutil.copyfile(os.path.join(SYNTHETIC_TESTS, f"{name}.py"), os.path.join(tmp, f"test_{name}.py"))
        with open(os.path.join(tmp, "pytest.ini"), "w", encoding="utf-8") as f:
            f.write("[pytest]\n")
        child_env = {k: v for k, v in os.environ.items() if k not in DETERMINISM_ENV}
        child_env.update(PYTHONPATH=os.pathsep.join(pythonpath), GPU_CHECK_RECORD=os.path.join(tmp, "record.json"))
        child_env.update(env or {})
        res, tests = _pytest(["-p", "no:randomly", f"test_{name}.py", *pytest_args], child_env, timeout, tmp, tmp)
        record = {}
        if os.path.isfile(f"{tmp}/record.json"):
            with open(f"{tmp}/record.json", encoding="utf-8") as f:
                record = json.load(f)
    return res, tests, record


def _number(value):  # JSON has no inf: the largest difference is a number, or "inf" where structures differ
    return value if math.isfinite(value) else str(value)


def run_parity_after_cublas(root, pythonpath, timeout, warn_only=False):
    """Part (b): one pytest process runs a CUDA fp16/fp32 matmul without CUBLAS_WORKSPACE_CONFIG, then the parity test's
    method in the same process (`_INSIDE_SUB_PROCESS=1`), whose assert_close comparisons are measured. Two expected
    outcomes: torch's cuBLAS-configuration RuntimeError (a torch that has the check), or a bit-exact run. `warn_only`:
    the variant whose `enable_full_determinism` passes `warn_only=True` (the check warns instead of raising)."""
    test = _parity_test()
    if not os.path.isfile(os.path.join(root, test)):
        return {"status": "no_tests", "reason": f"{test} not found under {root}", "bit_exact": None}
    method = PARITY_NODE.split("::")[-1]
    env = {"RUN_SLOW": "1", "_INSIDE_SUB_PROCESS": "1", "GPU_CHECK_PARITY_NODE": os.path.join(root, PARITY_NODE)}
    if warn_only:
        env["GPU_CHECK_WARN_ONLY"] = "1"
    selected = ("-k", f"warmup or {method} or import_failed")
    res, tests, record = run_synthetic("cublas_then_parity", pythonpath, timeout, env, selected)
    warmup = [t for t in tests if "warmup" in t["test"]]
    parity = [t for t in tests if "warmup" not in t["test"]]
    runs = {k.split(":", 1)[1]: v for k, v in record.items() if k.startswith("parity:")}
    comparisons = [c for run in runs.values() for c in run["comparisons"]]
    measured = [float(c) for c in comparisons if not str(c).startswith("not measured")]
    bit_exact = None
    if measured and len(measured) == len(comparisons):
        bit_exact = max(measured) == 0
    elif measured and max(measured) > 0:
        bit_exact = False
    raised = [run["raised"] for run in runs.values() if run.get("raised")]
    cublas_error = next((r for r in raised if CUBLAS_CONFIG_ERROR in r["message"]), None)
    res.update(
        node=PARITY_NODE,
        warn_only=warn_only,
        tests=tests,
        warmup={"outcome": warmup[0]["outcome"] if warmup else None, **record.get("warmup", {})},
        parity_runs=runs,
        comparisons=comparisons,
        max_abs_diff=_number(max(measured)) if measured else None,
        bit_exact=bit_exact,
        outcome=None,
    )
    after = [run["state_after"] for run in runs.values()]
    if after and not all(s["deterministic_algorithms"] and s["CUBLAS_WORKSPACE_CONFIG"] for s in after):
        res["note"] = "the parity test left deterministic algorithms or CUBLAS_WORKSPACE_CONFIG unset: see parity_runs"
    outcomes = {t["outcome"] for t in parity}
    if res.get("status") == "error":
        pass
    elif "import_error" in record:
        res.update(status="error", reason="importing the parity test module failed: " + record["import_error"][-300:])
    elif tests and {t["outcome"] for t in tests} == {"skipped"}:
        res.update(status="skipped", reason="; ".join(sorted({t["message"] for t in tests})))
    elif not parity:
        res.update(status="no_tests", reason=f"{method} was not collected")
    elif cublas_error:  # expected where torch has the check: the finding is "a used worker cannot run this test"
        res.update(status="passed", outcome="cublas_config_error", cublas_config_error=cublas_error)
        res["note"] = f"torch's cuBLAS-configuration RuntimeError, raised at {cublas_error['where']}"
    elif bit_exact is False or outcomes & {"failed", "error"}:
        diff = f"max abs difference {res['max_abs_diff']}" if bit_exact is False else "no difference measured"
        what = f"; raised {raised[0]['type']}: {raised[0]['message'][:200]}" if raised else ""
        res.update(
            status="failed", reason=f"the parity test after the cuBLAS warm-up: {sorted(outcomes)}, {diff}{what}"
        )
    elif not warmup or warmup[0]["outcome"] != "passed" or tests.index(warmup[0]) > tests.index(parity[0]):
        res.update(status="error", reason="the cuBLAS warm-up did not pass before the parity test ran")
    elif bit_exact is None:
        res.update(status="error", reason="the parity test passed but no torch.testing.assert_close was measured")
    else:
        res.update(status="passed", outcome="measured")
    return res


def run_parity_after_cublas_part(root, pythonpath, timeout):
    """Part (b), then, where it met the cuBLAS-configuration error and time is left, its warn_only variant (under
    `warn_only_variant`, informative: it does not change the part's status)."""
    deadline = time.monotonic() + timeout
    res = run_parity_after_cublas(root, pythonpath, timeout)
    left = deadline - time.monotonic()
    if res.get("outcome") == "cublas_config_error":
        if left >= 30:
            res["warn_only_variant"] = run_parity_after_cublas(root, pythonpath, left, warn_only=True)
        else:
            res["warn_only_variant"] = {"status": "error", "reason": f"not started: {left:.0f} s left in this part"}
    return res


# Part (c): what the second test is expected to do after the first left deterministic mode on, per mode
LEAK_MODES = {"in_process": ({}, "failed"), "run_test_using_subprocess": ({"GPU_CHECK_DECORATED": "1"}, "passed")}


def run_deterministic_leak(pythonpath, timeout):
    """Part (c): the first test turns on full determinism and restores nothing; the second calls an op without a
    deterministic CUDA implementation. In process the second should fail, with the first test decorated pass."""
    res, deadline = {"modes": {}}, time.monotonic() + timeout
    for mode, (env, expected) in LEAK_MODES.items():
        left = deadline - time.monotonic()
        if left < 10:
            res["modes"][mode] = {"status": "error", "reason": f"out of this part's {timeout:.0f} s"}
            continue
        run, tests, record = run_synthetic("deterministic_leak", pythonpath, left, env)
        first = next((t for t in tests if "test_1_" in t["test"]), {})
        second = next((t for t in tests if "test_2_" in t["test"]), {})
        res["op"] = res.get("op") or record.get("op")
        run.update(
            tests=tests,
            state_after_first_test=record.get("state_after_first_test"),
            first_test=first.get("outcome"),
            second_test=second.get("outcome"),
            second_test_message=second.get("message"),
            expected_second_test=expected,
        )
        if run.get("status") == "error":
            pass
        elif first.get("outcome") != "passed" or not second:
            run.update(
                status="error", reason=f"the first test {first.get('outcome')}, the second {second.get('outcome')}"
            )
        elif second["outcome"] == "skipped":
            run.update(status="skipped", reason=second.get("message"))
        else:
            run["as_expected"] = second["outcome"] == expected and (
                expected == "passed" or NO_DETERMINISTIC_IMPLEMENTATION in (second.get("message") or "")
            )
            run["status"] = "passed" if run["as_expected"] else "failed"
            if not run["as_expected"]:
                want = "failed with '" + NO_DETERMINISTIC_IMPLEMENTATION + "'" if expected == "failed" else expected
                run["reason"] = f"the second test {second['outcome']}, expected {want}"
        res["modes"][mode] = run
    for status in ("error", "failed", "skipped"):
        reasons = [f"{mode}: {m.get('reason')}" for mode, m in res["modes"].items() if m["status"] == status]
        if reasons:
            return {**res, "status": status, "reason": "; ".join(reasons)[:600]}
    return {**res, "status": "passed"}


def run_bench(args, patched_src, stock, extra, deadline):
    """The benchmark, stock and patched accelerate in separate processes, alternated (patched, stock, stock, patched,
    ...); `stock` was checked against the patched one before (`check_stock`)."""
    variants = {
        "patched": ([patched_src, *extra], {"expect_under": patched_src}),
        "stock": (
            [stock["src"], *extra] if stock.get("src") else extra,
            {"expect_under": stock.get("src"), "expect_file": stock.get("file")},
        ),
    }
    runs, note = {name: [] for name in variants}, None
    for r in range(args.repeats):
        for name in sorted(variants, reverse=r % 2 == 1):
            path, cfg = variants[name]
            left = deadline - time.monotonic()
            if left < 20:  # out of --timeout: what ran so far is reported
                note = f"out of time after {r} of {args.repeats} repeats"
                break
            runs[name].append(_child("bench", {**cfg, "steps": args.steps}, path, min(left, 90)))
    bad = [run for rs in runs.values() for run in rs if run.get("status") != "ok"]
    if bad or not all(runs.values()):
        bad = bad or [{"status": "error", "reason": "out of time (--timeout) before every variant ran"}]
        return {"status": bad[0]["status"], "reason": bad[0].get("reason"), "note": note, "runs": runs}
    res = {"status": "ok", "note": note, "steps": args.steps, "repeats": args.repeats, "scenarios": {}, "runs": runs}
    for scen in runs["patched"][0]["scenarios"]:
        summary = {}
        for name, rs in runs.items():
            per = [run["scenarios"][scen] for run in rs]
            summary[name] = {
                "ms_per_step": round(statistics.median(v for p in per for v in p["ms_per_step_cuda_events"]), 4),
                "ms_per_step_wall": round(statistics.median(v for p in per for v in p["ms_per_step_wall"]), 4),
                "syncs_per_step": per[0]["syncs_per_step"],
                "skips": per[0]["skips"],
                "reported_skipped": per[0]["reported_skipped"],
                "reported_matches_truth": all(p["reported_matches_truth"] for p in per),
            }
        # One ratio per repeat (that repeat's patched process over its stock process, medians of CUDA-event times)
        per_repeat = [
            round(
                statistics.median(p["scenarios"][scen]["ms_per_step_cuda_events"])
                / statistics.median(q["scenarios"][scen]["ms_per_step_cuda_events"]),
                4,
            )
            for p, q in zip(runs["patched"], runs["stock"])
        ]
        summary.update(
            ratio_patched_over_stock=round(summary["patched"]["ms_per_step"] / summary["stock"]["ms_per_step"], 4),
            ratios_per_repeat=per_repeat,
            ratio_min=min(per_repeat),
            ratio_max=max(per_repeat),
        )
        if not summary["patched"]["reported_matches_truth"]:
            res.update(status="failed", reason=f"patched step_was_skipped missed skipped updates ({scen})")
        res["scenarios"][scen] = summary
    return res


def check_stock(patched, stock, pinned):
    """Errors that make the stock/patched comparison meaningless (refused before timing): `patched` and `stock` are
    the package records (file, version, has_fused_skip_patch), `pinned` the accelerate version of
    patches/config.json (None when unreadable)."""
    errors = []
    if stock.get("has_fused_skip_patch") is not False:
        errors.append(f"the stock accelerate at {stock.get('file')} has the fused-skip patch (or was not found)")
    if not patched.get("has_fused_skip_patch"):
        errors.append(f"the patched accelerate at {patched.get('file')} lacks the fused-skip patch")
    if stock.get("version") != patched.get("version"):
        errors.append(f"versions differ: stock {stock.get('version')}, patched {patched.get('version')}")
    if pinned and patched.get("version") != pinned:
        errors.append(
            f"patched accelerate {patched.get('version')} is not the pinned {pinned} (run `make fork` first)"
        )
    return errors


def pinned_versions():
    """{package: version} from patches/config.json ({} when it cannot be read)."""
    try:
        with open(os.path.join(REPO_ROOT, "patches", "config.json"), encoding="utf-8") as f:
            upstreams = json.load(f)["upstreams"]
        return {u["package"]: u["version"] for u in upstreams.values()}
    except (OSError, KeyError, TypeError, ValueError):
        return {}


def unpack(carry, tmp):
    found = {}
    for name in ("transformers", "accelerate", "accelerate-stock"):
        archive = os.path.join(carry, f"{name}.tar.gz")
        if os.path.isfile(archive):
            with tarfile.open(archive) as tar:
                tar.extractall(os.path.join(tmp, name), filter="data")
            found[name] = os.path.join(tmp, name, "src")
    for wheel in sorted(glob.glob(os.path.join(carry, "*.whl")) + glob.glob(os.path.join(carry, "*.zip"))):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(os.path.join(tmp, "site"))
        found["site"] = os.path.join(tmp, "site")
    return found


def _test_lines(tests, indent):
    lines = []
    for test in tests:
        message = " | ".join(test.get("message", "").splitlines())
        lines.append(f"{indent}{test['outcome']:<7} {test['test']} ({test['duration_s']} s) {message}"[:400])
    return lines


def summary_lines(report):
    m, pk = report["machine"], report["packages"]
    t, v = m.get("torch", {}), m.get("versions", {})
    done = f"exit {report['exit_code']}  wall {report['wall_s']} s" if "exit_code" in report else "(in progress)"
    lines = [
        f"gpu_check {report['started']}  {done}  every part as expected: {report.get('all_expected')}",
        f"python {m.get('python')}  torch {t.get('version')} ({t.get('git_version')}, CUDA build {t.get('cuda_build')})"
        f"  GPU {t.get('gpu')}  pytest {v.get('pytest')}  parameterized {v.get('parameterized')}",
        f"nvidia-smi (name, driver, memory): {m.get('nvidia_smi')}",
    ]
    for name in ("transformers", "accelerate", "stock_accelerate"):
        p = pk.get(name, {})
        lines.append(
            f"{name}: {p.get('version')} from {p.get('file')}" + (f"  ERROR {p['error']}" if "error" in p else "")
        )
    if pk.get("stock_accelerate", {}).get("same_as_patched"):
        lines.append("  stock and patched resolve to the same files: no stock comparison")
    for part, res in report["parts"].items():
        mark = "" if "expected" not in res else (" (expected)" if res["expected"] else " (NOT EXPECTED)")
        lines.append(
            f"{part}: {res['status']}{mark}" + "".join(f" - {res[k]}" for k in ("reason", "note") if res.get(k))
        )
        lines += _test_lines(res.get("tests", []), "  ")
        for label, r in (("", res), ("warn_only variant: ", res.get("warn_only_variant") or {})):
            if r.get("bit_exact") is not None or "comparisons" in r:
                n, warmup = len(r.get("comparisons", [])), r.get("warmup", {}).get("outcome")
                lines.append(
                    f"  {label}{r.get('status')}, outcome {r.get('outcome')}, bit_exact {r.get('bit_exact')}, max abs"
                    f" difference {r.get('max_abs_diff')} over {n} comparisons; cuBLAS warm-up {warmup}"
                )
        if res.get("cublas_config_error"):
            err = res["cublas_config_error"]
            lines.append(f"  {err['type']} at {err['where']}: {err['message'].splitlines()[0][:200]}")
        if res.get("op"):
            lines.append(f"  op: {res['op']}")
        for mode, m in res.get("modes", {}).items():
            seen = m.get("state_after_first_test") or {}
            after = ", ".join(f"{k} {v}" for k, v in seen.items())
            lines.append(
                f"  {mode}: {m['status']}, second test {m.get('second_test')}"
                + f" (expected {m.get('expected_second_test')})"
                + (f"; after the first test: {after}" if seen else "")
                + (f" - {m['reason']}" if m.get("reason") else "")
            )
            lines += _test_lines(m.get("tests", []), "    ")
        for scen, s in res.get("scenarios", {}).items():
            line = (
                f"  {scen}: ratio patched/stock {s.get('ratio_patched_over_stock')} (per repeat"
                f" {s.get('ratios_per_repeat')}, min {s.get('ratio_min')}, max {s.get('ratio_max')})"
            )
            for name in ("stock", "patched"):
                if name in s:
                    v, sy = s[name], s[name]["syncs_per_step"]
                    line += (
                        f"; {name} {v['ms_per_step']:.4f} ms/step, syncs step()/flag {sy['optimizer_step']:g}/"
                        f"{sy['step_was_skipped']:g}, skips reported {v['reported_skipped']}/{v['skips']['truly_skipped']}"
                    ) + ("" if v["reported_matches_truth"] else " MISSED" + (" (expected)" if name == "stock" else ""))
            lines.append(line)
    return lines


def main(argv=None):
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="folder for gpu_check.json and gpu_check.txt (required)")
    parser.add_argument("--unpack", metavar="CARRY", help="folder with transformers/accelerate[-stock].tar.gz, *.whl")
    parser.add_argument("--transformers-src", help="default build/transformers/src")
    parser.add_argument("--accelerate-src", help="default build/accelerate/src")
    parser.add_argument(
        "--stock-accelerate-src",
        help="default: the carried stock archive, else build/stock/src (the pinned release, left by `make fork`), else "
        "the accelerate the interpreter imports by itself",
    )
    parser.add_argument("--steps", type=int, default=300, help="timed steps per scenario and repeat")
    parser.add_argument("--repeats", type=int, default=2, help="processes per accelerate variant")
    parser.add_argument("--timeout", type=float, default=360, help="total wall budget, seconds")
    parser.add_argument("--require-cuda", action="store_true", help="exit 1 unless the parts ran on a CUDA GPU")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in this order: {','.join(PARTS)}")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        try:
            result = {"probe": child_probe, "bench": child_bench}[args.child[0]](json.loads(args.child[1]))
        except Exception:  # reported to the parent as this part's error, with the traceback
            result = {"status": "error", "reason": traceback.format_exc(limit=-3)[-1500:]}
        print(MARK + json.dumps(result))
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    if args.steps < 16 or args.repeats < 1 or args.timeout <= 0:
        parser.error("--steps must be >= 16, --repeats >= 1, --timeout > 0")
    wanted = set(args.parts.split(","))
    if not wanted <= set(PARTS):
        parser.error(f"--parts: unknown {','.join(sorted(wanted - set(PARTS)))} (known: {','.join(PARTS)})")
    args.parts = [part for part in PARTS if part in wanted]
    args.out = existing = os.path.abspath(args.out)
    while not os.path.exists(existing):  # the folder that --out would be created in
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        parser.error(f"--out {args.out}: {existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        parser.error(f"--out {args.out}: {existing} is not writable")
    if args.unpack and not os.path.isdir(args.unpack):
        parser.error(f"--unpack {args.unpack} is not a folder")
    tmp = tempfile.mkdtemp(prefix="gpu_check_")
    try:
        found = unpack(args.unpack, tmp) if args.unpack else {}
        srcs = {
            "transformers": args.transformers_src
            or found.get("transformers")
            or f"{REPO_ROOT}/build/transformers/src",
            "accelerate": args.accelerate_src or found.get("accelerate") or f"{REPO_ROOT}/build/accelerate/src",
            "stock_accelerate": args.stock_accelerate_src
            or found.get("accelerate-stock")
            or (STOCK_SRC if os.path.isdir(f"{STOCK_SRC}/accelerate") else None),
        }
        for name, path in srcs.items():
            if path and not os.path.isdir(path):
                parser.error(f"{name} sources not found: {path} (see --unpack and the docstring)")
        os.makedirs(args.out, exist_ok=True)
        srcs = {k: v and os.path.abspath(v) for k, v in srcs.items()}
        return check(args, srcs, [found["site"]] if "site" in found else [])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cuda_skip(smi, probe):
    t = probe.get("torch") or {}
    if probe.get("status") == "error":
        return {"status": "error", "reason": f"probe: {probe['reason']}", "output_tail": probe.get("output_tail")}
    if not smi:
        return {"status": "skipped", "reason": "no NVIDIA GPU: nvidia-smi not found on PATH"}
    if not t.get("cuda_build"):
        return {"status": "skipped", "reason": f"torch {t.get('version')} is not a CUDA build"}
    if not t.get("cuda_available"):
        return {"status": "skipped", "reason": "torch.cuda.is_available() is False"}
    return None


def write_outputs(report, out):
    """Writes gpu_check.json and gpu_check.txt into `out`, each whole to a temp file renamed into place; returns the
    summary text."""
    text = "\n".join(summary_lines(report)) + "\n"
    for name, content in (("gpu_check.json", json.dumps(report, indent=2) + "\n"), ("gpu_check.txt", text)):
        tmp = os.path.join(out, f".{name}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(content)
            os.replace(tmp, os.path.join(out, name))
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return text


def expected(part, require_cuda):
    """Whether a part had its expected outcome: passed (ok), or skipped where --require-cuda is not given."""
    return part["status"] in ("passed", "ok") or (part["status"] == "skipped" and not require_cuda)


def run_part(part, runner, report, out):
    """Runs one part, guarded: an exception becomes the part's error record with its traceback. The report is
    written after it either way."""
    try:
        report["parts"][part] = runner()
    except Exception as e:
        report["parts"][part] = {
            "status": "error",
            "reason": f"{part} raised {type(e).__name__}: {e}"[:600],
            "traceback": traceback.format_exc()[-3000:],
        }
    write_outputs(report, out)


def check(args, srcs, extra):
    start, deadline = time.perf_counter(), time.monotonic() + args.timeout
    tf_src, acc_src, stock_src = srcs["transformers"], srcs["accelerate"], srcs["stock_accelerate"]
    report = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:], "parts": {}}
    report["require_cuda"] = args.require_cuda
    smi = shutil.which("nvidia-smi")
    machine = report["machine"] = {"host": platform.node(), "nvidia_smi": "not found on PATH"}
    if smi:
        rc, text = _run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], None, 30)
        machine["nvidia_smi"] = text.strip() if rc == 0 else f"exited {rc}: {text.strip()[:300]}"
    expect = {"transformers": tf_src, "accelerate": acc_src}
    probe = _child("probe", {"expect": expect}, [tf_src, acc_src, *extra], 120)
    stock = _child("probe", {"find_only": True}, [stock_src, *extra] if stock_src else extra, 60)
    machine.update({k: probe[k] for k in ("python", "executable", "torch", "have", "versions") if k in probe})
    pk = report["packages"] = {name: probe.get(name, {}) for name in expect}
    s = pk["stock_accelerate"] = dict(stock.get("accelerate") or {"error": stock.get("reason")}, src=stock_src)
    if stock_src and "file" in s and not _under(s["file"], stock_src):
        s["error"] = f"stock accelerate found at {s['file']}, not under {stock_src}"
    for p in (pk["accelerate"], s):
        if "file" in p:
            p.update(version=p.get("version") or _version_of(p["file"]), has_fused_skip_patch=_patched(p["file"]))
    if "file" in s and "file" in pk["accelerate"]:
        s["same_as_patched"] = os.path.realpath(s["file"]) == os.path.realpath(pk["accelerate"]["file"])
    report["pinned"] = pinned_versions()
    skip = _cuda_skip(smi, probe)
    if skip and args.require_cuda and skip["status"] == "skipped":
        skip = {"status": "error", "reason": f"--require-cuda: {skip['reason']}"}
    write_outputs(report, args.out)
    tf_path = [tf_src, acc_src, *extra]
    for i, part in enumerate(args.parts):
        needs = ("accelerate",) if part == "fused_skip_cost" else ("transformers", "accelerate")
        errors = [f"{n}: {pk[n]['error']}" for n in needs if "error" in pk[n]]
        if part != "fused_skip_cost" and not skip:
            wanted = ("pytest",) if part == "deterministic_leak" else ("pytest", "parameterized")
            errors += [f"{n} not importable (carry its wheel)" for n in wanted if not machine["have"].get(n)]
        if part == "fused_skip_cost":
            errors += [f"stock accelerate: {s['error']}"] if "error" in s else []
            errors += check_stock(pk["accelerate"], s, report["pinned"].get("accelerate"))
        cap = PARTS[part][0]
        left = deadline - time.monotonic() - sum(PARTS[later][1] for later in args.parts[i + 1 :])
        if skip or errors:
            runner = functools.partial(dict, skip or {"status": "error", "reason": "; ".join(errors)})
        elif left < PARTS[part][1]:
            runner = functools.partial(dict, status="error", reason=f"not started: {left:.0f} s of --timeout left")
        elif part == "parity":
            runner = functools.partial(run_parity, os.path.dirname(tf_src), tf_path, min(cap, left))
        elif part == "parity_after_cublas":
            runner = functools.partial(run_parity_after_cublas_part, os.path.dirname(tf_src), tf_path, min(cap, left))
        elif part == "deterministic_leak":
            runner = functools.partial(run_deterministic_leak, tf_path, min(cap, left))
        else:
            runner = functools.partial(run_bench, args, acc_src, s, extra, deadline)
        run_part(part, runner, report, args.out)
    for part in report["parts"].values():
        part["expected"] = expected(part, args.require_cuda)
    report["all_expected"] = all(p["expected"] for p in report["parts"].values())
    if args.require_cuda and not any(p["status"] in ("passed", "ok", "failed") for p in report["parts"].values()):
        report["all_expected"] = False  # nothing ran on a GPU
    report["exit_code"] = 0 if report["all_expected"] else 1
    report["wall_s"] = round(time.perf_counter() - start, 1)
    sys.stdout.write(write_outputs(report, args.out))
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
