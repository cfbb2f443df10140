"""Tests for bench/gpu_check.py on CPU: the CUDA parts are skipped with a reason, the output is whole or absent."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("workbench_gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)
# Part (b)'s synthetic test file, for its comparison helper (it imports torch: here, at collection, not in a test)
_spec = importlib.util.spec_from_file_location(
    "gpu_check_cublas_then_parity", REPO_ROOT / "bench" / "gpu_check_tests" / "cublas_then_parity.py"
)
cublas_then_parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cublas_then_parity)
torch = cublas_then_parity.torch


def run_script(tmp_path, *args):
    # An empty PATH: no nvidia-smi, whatever the machine; the script only starts `sys.executable`.
    (tmp_path / "bin").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(tmp_path / "bin")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_cpu_run_skips_the_cuda_parts_and_writes_both_files(tmp_path):
    out = tmp_path / "out"
    proc = run_script(tmp_path, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.txt"]
    report = json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))
    assert report["exit_code"] == 0
    assert list(report["parts"]) == ["parity", "parity_after_cublas", "deterministic_leak", "fused_skip_cost"]
    for part in report["parts"].values():
        assert part == {"status": "skipped", "reason": "no NVIDIA GPU: nvidia-smi not found on PATH", "expected": True}
    assert report["machine"]["torch"]["version"]
    assert report["machine"]["torch"]["git_version"]
    assert report["machine"]["versions"]["pytest"] == pytest.__version__
    assert report["all_expected"] is True
    for name in ("transformers", "accelerate"):
        assert "error" not in report["packages"][name], report["packages"][name]
        assert report["packages"][name]["file"].endswith(f"{name}/__init__.py")
    # After `make fork`, "stock" is the pinned release's pristine source, never the fork the interpreter finds
    stock = report["packages"]["stock_accelerate"]
    assert stock["src"] == str(REPO_ROOT / "build/stock/src"), stock
    assert stock["same_as_patched"] is False and stock["has_fused_skip_patch"] is False
    summary = (out / "gpu_check.txt").read_text(encoding="utf-8")
    for part in report["parts"]:
        assert f"{part}: skipped (expected) - no NVIDIA GPU" in summary
    assert 5 <= len(summary.splitlines()) <= 20

    # --require-cuda: the same machine fails, clearly, and still writes both files
    proc = run_script(tmp_path, "--out", str(tmp_path / "required"), "--require-cuda")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "required" / "gpu_check.json").read_text(encoding="utf-8"))
    assert report["all_expected"] is False
    for part in report["parts"].values():
        assert part["status"] == "error"
        assert part["reason"] == "--require-cuda: no NVIDIA GPU: nvidia-smi not found on PATH"

    # --parts selects parts, in the script's order
    proc = run_script(tmp_path, "--out", str(out), "--parts", "deterministic_leak,parity")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))
    assert list(report["parts"]) == ["parity", "deterministic_leak"]
    proc = run_script(tmp_path, "--out", str(out), "--parts", "parity,nope")
    assert proc.returncode == 2
    assert "--parts: unknown nope" in proc.stderr


def test_out_that_is_a_file_fails_clearly_and_writes_nothing(tmp_path):
    target = tmp_path / "taken"
    target.write_text("keep", encoding="utf-8")
    for out in (target, target / "sub"):
        proc = run_script(tmp_path, "--out", str(out))
        assert proc.returncode == 2
        assert "exists and is not a folder" in proc.stderr
    assert target.read_text(encoding="utf-8") == "keep"
    assert sorted(os.listdir(tmp_path)) == ["bin", "taken"]


def test_expected_outcomes_and_require_cuda():
    assert gpu_check.expected({"status": "passed"}, require_cuda=True)
    assert gpu_check.expected({"status": "ok"}, require_cuda=True)
    assert gpu_check.expected({"status": "skipped"}, require_cuda=False)
    assert not gpu_check.expected({"status": "skipped"}, require_cuda=True)
    for status in ("failed", "error", "no_tests"):
        assert not gpu_check.expected({"status": status}, require_cuda=False)


def test_every_child_runs_offline(monkeypatch):
    for name in gpu_check.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    code = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))" % list(gpu_check.OFFLINE_ENV)
    rc, out = gpu_check._run([sys.executable, "-c", code], None, 60)
    assert rc == 0
    assert json.loads(out) == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    rc, out = gpu_check._run([sys.executable, "-c", code], {"PATH": os.environ.get("PATH", "")}, 60)
    assert json.loads(out)["HF_HUB_OFFLINE"] == "1"


def test_a_part_that_raises_is_recorded_and_every_part_is_written_when_it_ends(tmp_path, monkeypatch):
    # Stand-ins: a probe that saw CUDA (nothing here has it), and parts that raise or read what was written before them
    def child(mode, cfg, pythonpath, timeout):
        if cfg.get("find_only"):
            return {"accelerate": {"error": "no stock here"}}
        torch_record = {"version": "stand-in", "cuda_build": "12.8", "cuda_available": True}
        return {"python": "3", "torch": torch_record, "have": {"pytest": True, "parameterized": True}} | {
            name: {"file": f"{src}/{name}/__init__.py", "version": "1"} for name, src in cfg["expect"].items()
        }

    def parity(*args):
        raise KeyError("no junit report")

    seen = {}

    def after_cublas(*args):
        seen.update(json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))["parts"])
        return {"status": "passed", "outcome": "measured"}

    monkeypatch.setattr(gpu_check, "_child", child)
    monkeypatch.setattr(gpu_check, "_patched", lambda module_file: True)
    monkeypatch.setattr(gpu_check, "run_parity", parity)
    monkeypatch.setattr(gpu_check, "run_parity_after_cublas_part", after_cublas)
    monkeypatch.setattr(gpu_check.shutil, "which", lambda name: None)
    monkeypatch.setattr(gpu_check, "_cuda_skip", lambda smi, probe: None)
    args = argparse.Namespace(
        timeout=300, out=str(tmp_path), parts=["parity", "parity_after_cublas"], require_cuda=True
    )
    srcs = {"transformers": "tf", "accelerate": "acc", "stock_accelerate": None}
    assert gpu_check.check(args, srcs, []) == 1
    assert seen["parity"]["status"] == "error"  # written before the next part began
    report = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    parity = report["parts"]["parity"]
    assert parity["reason"] == "parity raised KeyError: 'no junit report'"
    assert "in parity" in parity["traceback"] and "KeyError" in parity["traceback"]
    assert not parity["expected"]
    assert report["parts"]["parity_after_cublas"] == {"status": "passed", "outcome": "measured", "expected": True}
    assert sorted(os.listdir(tmp_path)) == ["gpu_check.json", "gpu_check.txt"]


def fake_accelerate(root, version, patched):
    package = root / "accelerate"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n', encoding="utf-8")
    step = "self._found_inf = found_inf" if patched else "pass"
    (package / "optimizer.py").write_text(f"def step(self):\n    {step}\n", encoding="utf-8")
    path = str(package / "__init__.py")
    return {"file": path, "version": gpu_check._version_of(path), "has_fused_skip_patch": gpu_check._patched(path)}


def test_stock_and_patched_accelerate_are_checked_before_timing(tmp_path):
    pinned = gpu_check.pinned_versions()["accelerate"]  # patches/config.json, whatever version it pins now
    assert pinned
    patched = fake_accelerate(tmp_path / "patched", pinned, patched=True)
    stock = fake_accelerate(tmp_path / "stock", pinned, patched=False)
    assert gpu_check.check_stock(patched, stock, pinned) == []
    # a "stock" with the patch (e.g. the fork found by the interpreter), a "patched" without it
    assert gpu_check.check_stock(patched, patched, pinned) == [
        f"the stock accelerate at {patched['file']} has the fused-skip patch (or was not found)"
    ]
    assert gpu_check.check_stock(stock, stock, pinned) == [
        f"the patched accelerate at {stock['file']} lacks the fused-skip patch"
    ]
    other = fake_accelerate(tmp_path / "other", "0.0.1", patched=False)
    assert gpu_check.check_stock(patched, other, pinned) == [f"versions differ: stock 0.0.1, patched {pinned}"]
    stale = fake_accelerate(tmp_path / "stale", "0.0.1", patched=True)
    assert gpu_check.check_stock(stale, other, pinned) == [
        f"patched accelerate 0.0.1 is not the pinned {pinned} (run `make fork` first)"
    ]


PARITY_TESTS = """
import os


def test_resume_on_accelerator():
    # As upstream's CI runs it: nothing of full_determinism preset (its enable_full_determinism sets it in the test)
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None, os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    assert os.environ["RUN_SLOW"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
    assert False, "state['model']['w'] differs: max abs difference 0.001"


def test_not_selected():
    raise RuntimeError("must not run")
"""


def test_parity_runs_the_one_node_as_upstream_ci_and_reports_the_failure_message(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "PARITY_NODE", "tests/trainer/test_fake_parity.py::test_resume_on_accelerator")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # set here; the child must not inherit it
    assert gpu_check.run_parity(str(tmp_path), [], 60)["status"] == "no_tests"
    test_file = tmp_path / "tests" / "trainer" / "test_fake_parity.py"
    test_file.parent.mkdir(parents=True)
    test_file.write_text(PARITY_TESTS, encoding="utf-8")
    result = gpu_check.run_parity(str(tmp_path), [], 60)
    assert result["status"] == "failed"
    assert [t["test"].rsplit("::", 1)[1] for t in result["tests"]] == ["test_resume_on_accelerator"]
    assert result["tests"][0]["outcome"] == "failed"
    assert "differs: max abs difference 0.001" in result["tests"][0]["message"], result["tests"][0]
    assert result["preset"]["CUBLAS_WORKSPACE_CONFIG"] is None


def bench_result(ms, sync_flag, reported, truly=4):
    scenario = {
        "ms_per_step_cuda_events": [ms] * 3,
        "ms_per_step_wall": [ms] * 3,
        "syncs_per_step": {"forward_backward": 0, "optimizer_step": 0, "step_was_skipped": sync_flag, "zero_grad": 0},
        "skips": {"steps": 16, "injected": truly, "truly_skipped": truly},
        "reported_skipped": reported,
        "reported_matches_truth": reported == truly,
    }
    return {"status": "ok", "scenarios": {"overflow_every_4": scenario}}


def test_benchmark_alternates_the_variants_and_reports_per_repeat_ratios(monkeypatch):
    calls = []
    stock_ms = iter([1.0, 2.0])  # the stock process is slower in the second repeat

    def child(mode, cfg, pythonpath, timeout):
        calls.append(pythonpath[0])
        return bench_result(1.1, 1.0, 4) if pythonpath[0] == "patched" else bench_result(next(stock_ms), 0.0, 0)

    monkeypatch.setattr(gpu_check, "_child", child)
    args = argparse.Namespace(steps=16, repeats=2)
    res = gpu_check.run_bench(args, "patched", {"src": "stock", "file": "stock/f.py"}, [], time.monotonic() + 100)
    assert calls == ["patched", "stock", "stock", "patched"]
    assert res["status"] == "ok"
    scenario = res["scenarios"]["overflow_every_4"]
    assert scenario["ratios_per_repeat"] == [1.1, 0.55]
    assert (scenario["ratio_min"], scenario["ratio_max"]) == (0.55, 1.1)
    assert scenario["ratio_patched_over_stock"] == 0.7333  # pooled: 1.1 over the median of 1.0, 1.0, 2.0, 2.0
    assert scenario["patched"]["syncs_per_step"]["step_was_skipped"] == 1.0
    assert not scenario["stock"]["reported_matches_truth"]
    summary = gpu_check.summary_lines(
        {"started": "t", "exit_code": 0, "wall_s": 1, "machine": {}, "packages": {}, "parts": {"fused_skip_cost": res}}
    )
    assert any("ratio patched/stock 0.7333 (per repeat [1.1, 0.55], min 0.55, max 1.1)" in line for line in summary)


# The synthetic test files of parts (b) and (c), run on CPU: what needs CUDA skips with the reason, the rest is real.
PATH_FORKS = [str(REPO_ROOT / "build" / "transformers" / "src"), str(REPO_ROOT / "build" / "accelerate" / "src")]
# The tests below assert what the children do without CUDA (the warm-up, histc and the real parity test skip)
without_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="asserts the outcomes without CUDA; torch.cuda.is_available() is True here"
)


@without_cuda
def test_parity_after_cublas_on_cpu_collects_both_tests_and_skips_them_with_reasons():
    result = gpu_check.run_parity_after_cublas(str(REPO_ROOT / "build" / "transformers"), PATH_FORKS, 120)
    assert result["pytest_rc"] == 0, result["output_tail"]
    tests = {t["test"].rsplit("::", 1)[1]: t for t in result["tests"]}
    assert list(tests) == [
        "test_1_warmup_cublas_matmul_without_workspace_config",
        "test_resume_matches_uninterrupted_run_on_accelerator",
    ]
    assert tests["test_1_warmup_cublas_matmul_without_workspace_config"]["message"] == (
        "no CUDA: torch.cuda.is_available() is False"
    )
    assert tests["test_resume_matches_uninterrupted_run_on_accelerator"]["outcome"] == "skipped"
    assert result["status"] == "skipped"
    assert result["bit_exact"] is None
    assert result["max_abs_diff"] is None


FAKE_PARITY = """
import inspect
import unittest

import torch


class TrainerResumeFp16Test(unittest.TestCase):
    def setUp(self):  # as TestCasePlus, which finds the repository's root from the file of the test's class
        assert inspect.getfile(type(self)).endswith("test_fake_parity.py"), inspect.getfile(type(self))

    def test_resume_on_accelerator(self):
        if RAISE:  # a stand-in for torch's error at the first cuBLAS matmul (the real one needs CUDA)
            raise RuntimeError(RAISE)
        for diff in DIFFS:
            with self.subTest(diff=diff):
                expected = {"model": {"w": torch.tensor([1.0, 2.0])}, "log": [{"loss": 0.5}]}
                actual = {"model": {"w": torch.tensor([1.0, 2.0 + diff])}, "log": [{"loss": 0.5}]}
                torch.testing.assert_close(actual, expected, rtol=0, atol=0)

    def test_not_selected(self):
        raise RuntimeError("must not run")
"""
# torch's text (aten Context.cpp, alertCuBLASConfigNotDeterministic), shortened
CUBLAS_ERROR = (
    "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
    "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic because it uses CuBLAS "
    "and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set an environment variable"
)


def fake_parity_root(tmp_path, monkeypatch, source):
    node = "tests/trainer/test_fake_parity.py::TrainerResumeFp16Test::test_resume_on_accelerator"
    monkeypatch.setattr(gpu_check, "PARITY_NODE", node)
    test_file = tmp_path / "tests" / "trainer" / "test_fake_parity.py"
    test_file.parent.mkdir(parents=True)
    test_file.write_text(source, encoding="utf-8")
    return str(tmp_path)


@without_cuda
def test_parity_after_cublas_measures_the_comparisons_of_the_parity_test(tmp_path, monkeypatch):
    # A stand-in parity module (the real one skips without an accelerator): its comparisons are measured in-process
    root = fake_parity_root(tmp_path / "differs", monkeypatch, "RAISE = None\nDIFFS = (0.0, 0.5)\n" + FAKE_PARITY)
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["bit_exact"] is False
    assert result["max_abs_diff"] == 0.5
    assert result["comparisons"] == [0.0, 0.5]
    assert result["status"] == "failed"
    assert "max abs difference 0.5" in result["reason"]
    assert result["warmup"]["outcome"] == "skipped"  # no CUDA here
    run = result["parity_runs"]["test_resume_on_accelerator"]
    assert run["state_before"]["_INSIDE_SUB_PROCESS"] == "1"
    assert run["state_before"]["CUBLAS_WORKSPACE_CONFIG"] is None
    assert not any("test_not_selected" in t["test"] for t in result["tests"])

    # Bit-exact, but without the cuBLAS warm-up before it (no CUDA) the part proves nothing: an error, not a pass
    root = fake_parity_root(tmp_path / "equal", monkeypatch, "RAISE = None\nDIFFS = (0.0, 0.0)\n" + FAKE_PARITY)
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["bit_exact"] is True
    assert result["max_abs_diff"] == 0.0
    assert result["status"] == "error"
    assert "warm-up did not pass" in result["reason"]
    assert "deterministic algorithms" in result["note"]  # the stand-in sets neither

    root = fake_parity_root(tmp_path / "broken", monkeypatch, "raise ImportError('no such helper')\n")
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["status"] == "error"
    assert "ImportError: no such helper" in result["reason"]
    assert result["bit_exact"] is None


@without_cuda
def test_parity_after_cublas_records_the_cublas_configuration_error_as_its_own_outcome(tmp_path, monkeypatch):
    source = f"RAISE = {CUBLAS_ERROR!r}\nDIFFS = ()\n" + FAKE_PARITY
    root = fake_parity_root(tmp_path / "cublas", monkeypatch, source)
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["status"] == "passed", result
    assert result["outcome"] == "cublas_config_error"
    assert result["bit_exact"] is None
    error = result["cublas_config_error"]
    assert error["type"] == "builtins.RuntimeError"
    assert error["message"] == CUBLAS_ERROR
    assert error["where"].endswith(" in test_resume_on_accelerator")
    assert "test_fake_parity.py:" in error["where"]
    summary = gpu_check.summary_lines(
        {"started": "t", "machine": {}, "packages": {}, "parts": {"parity_after_cublas": result}}
    )
    assert any(line.startswith("  builtins.RuntimeError at ") for line in summary)

    # The part then runs its warn_only variant (here the stand-in raises again, whatever warn_only says)
    both = gpu_check.run_parity_after_cublas_part(root, [], 120)
    assert both["warn_only_variant"]["warn_only"] is True
    assert both["warn_only_variant"]["outcome"] == "cublas_config_error"

    # Any other error is a failure of the parity test, not this outcome
    root = fake_parity_root(
        tmp_path / "other", monkeypatch, "RAISE = 'CUDA out of memory'\nDIFFS = ()\n" + FAKE_PARITY
    )
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["status"] == "failed"
    assert result["outcome"] is None
    assert "raised builtins.RuntimeError: CUDA out of memory" in result["reason"]


def test_max_abs_diff_of_nested_records():
    max_abs_diff = cublas_then_parity.max_abs_diff
    record = {"a": torch.tensor([1.0, 2.0]), "b": [(0.1, 2), {"c": torch.tensor(3, dtype=torch.int64)}]}
    assert max_abs_diff(record, record) == 0.0
    assert max_abs_diff({**record, "a": torch.tensor([1.0, 2.25])}, record) == 0.25
    assert max_abs_diff({**record, "a": torch.tensor([1.0])}, record) == float("inf")
    assert max_abs_diff({**record, "a": torch.tensor([1.0, float("nan")])}, record) == float("inf")
    assert max_abs_diff({"a": record["a"]}, record) == float("inf")
    assert max_abs_diff({**record, "b": [(0.1, 2)]}, record) == float("inf")
    assert max_abs_diff("x", "y") == float("inf")
    # An overflow's inf grad norm (and a NaN) in the same places on both sides is no difference; in one only, it is
    inf, nan = float("inf"), float("nan")
    assert max_abs_diff([torch.tensor([1.0, inf, nan]), inf, nan], [torch.tensor([1.0, inf, nan]), inf, nan]) == 0.0
    assert max_abs_diff(torch.tensor([1.0, inf]), torch.tensor([1.0, 2.0])) == inf
    assert max_abs_diff(inf, 2.0) == inf
    assert max_abs_diff(nan, 2.0) == inf


@without_cuda
def test_deterministic_leak_on_cpu_records_what_the_first_test_leaves():
    result = gpu_check.run_deterministic_leak(PATH_FORKS, 120)
    assert result["op"] == "torch.histc on a CUDA tensor"
    assert result["status"] == "skipped"
    in_process, decorated = result["modes"]["in_process"], result["modes"]["run_test_using_subprocess"]
    for mode in (in_process, decorated):
        assert mode["first_test"] == "passed", mode["output_tail"]
        assert mode["second_test"] == "skipped"
        assert mode["reason"] == "no CUDA: torch.cuda.is_available() is False"
    # Measured here on CPU: in process, enable_full_determinism's settings stay for the next test; decorated, not
    assert in_process["state_after_first_test"] == {
        "deterministic_algorithms": True,
        "CUDA_LAUNCH_BLOCKING": "1",
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "_INSIDE_SUB_PROCESS": None,
    }
    assert decorated["state_after_first_test"] == dict.fromkeys(in_process["state_after_first_test"]) | {
        "deterministic_algorithms": False
    }


FAKE_LEAK = """
import os

import pytest


def test_1_full_determinism_not_restored():
    pass


def test_2_op_without_deterministic_cuda_implementation():
    if RAISES and os.environ.get("GPU_CHECK_DECORATED") != "1":
        raise RuntimeError("histc_cuda does not have a deterministic implementation, but you set it")
"""


def test_deterministic_leak_expects_the_error_in_process_only(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "SYNTHETIC_TESTS", str(tmp_path))
    (tmp_path / "deterministic_leak.py").write_text("RAISES = True\n" + FAKE_LEAK, encoding="utf-8")
    result = gpu_check.run_deterministic_leak([], 60)
    assert result["status"] == "passed", result
    assert result["modes"]["in_process"]["as_expected"]
    assert "does not have a deterministic" in result["modes"]["in_process"]["second_test_message"]
    assert result["modes"]["run_test_using_subprocess"]["second_test"] == "passed"

    (tmp_path / "deterministic_leak.py").write_text("RAISES = False\n" + FAKE_LEAK, encoding="utf-8")
    result = gpu_check.run_deterministic_leak([], 60)
    assert result["status"] == "failed"
    assert result["reason"] == (
        "in_process: the second test passed, expected failed with 'does not have a deterministic implementation'"
    )
    assert result["modes"]["run_test_using_subprocess"]["as_expected"]
    summary = gpu_check.summary_lines(
        {"started": "t", "exit_code": 1, "wall_s": 1, "machine": {}, "packages": {}, "parts": {"leak": result}}
    )
    assert any(line.startswith("  in_process: failed, second test passed (expected failed)") for line in summary)
