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
        assert part == {"status": "skipped", "reason": "no NVIDIA GPU: nvidia-smi not found on PATH"}
    assert report["machine"]["torch"]["version"]
    for name in ("transformers", "accelerate"):
        assert "error" not in report["packages"][name], report["packages"][name]
        assert report["packages"][name]["file"].endswith(f"{name}/__init__.py")
    assert "same_as_patched" in report["packages"]["stock_accelerate"]
    summary = (out / "gpu_check.txt").read_text(encoding="utf-8")
    for part in report["parts"]:
        assert f"{part}: skipped - no NVIDIA GPU" in summary
    assert 5 <= len(summary.splitlines()) <= 20

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


PARITY_TESTS = """
def test_resume_on_accelerator_passes():
    pass

def test_resume_on_accelerator_fails():
    assert False, "state['model']['w'] differs: max abs difference 0.001"

def test_not_selected():
    raise RuntimeError("must not run")
"""


def test_parity_reports_each_test_and_the_failure_message(tmp_path):
    assert gpu_check.run_parity(str(tmp_path), [], 60)["status"] == "no_tests"
    test_file = tmp_path / gpu_check.PARITY_TEST
    test_file.parent.mkdir(parents=True)
    test_file.write_text(PARITY_TESTS, encoding="utf-8")
    result = gpu_check.run_parity(str(tmp_path), [], 60)
    assert result["status"] == "failed"
    outcomes = {t["test"].rsplit("::", 1)[1]: t for t in result["tests"]}
    assert set(outcomes) == {"test_resume_on_accelerator_passes", "test_resume_on_accelerator_fails"}
    assert outcomes["test_resume_on_accelerator_passes"]["outcome"] == "passed"
    assert outcomes["test_resume_on_accelerator_fails"]["outcome"] == "failed"
    assert "differs: max abs difference 0.001" in outcomes["test_resume_on_accelerator_fails"]["message"]


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


def test_benchmark_alternates_the_variants_and_reports_the_ratio(monkeypatch):
    calls = []

    def child(mode, cfg, pythonpath, timeout):
        calls.append(pythonpath[0])
        return bench_result(1.1, 1.0, 4) if pythonpath[0] == "patched" else bench_result(1.0, 0.0, 0)

    monkeypatch.setattr(gpu_check, "_child", child)
    args = argparse.Namespace(steps=16, repeats=2)
    res = gpu_check.run_bench(args, "patched", {"src": "stock", "file": "stock/f.py"}, [], time.monotonic() + 100)
    assert calls == ["patched", "stock", "stock", "patched"]
    assert res["status"] == "ok"
    scenario = res["scenarios"]["overflow_every_4"]
    assert scenario["ratio_patched_over_stock"] == 1.1
    assert scenario["patched"]["syncs_per_step"]["step_was_skipped"] == 1.0
    assert not scenario["stock"]["reported_matches_truth"]
    summary = gpu_check.summary_lines(
        {"started": "t", "exit_code": 0, "wall_s": 1, "machine": {}, "packages": {}, "parts": {"fused_skip_cost": res}}
    )
    assert any("ratio patched/stock 1.1" in line for line in summary)

    same = gpu_check.run_bench(args, "patched", {"same_as_patched": True}, [], time.monotonic() + 100)
    assert "same files" in same["note"]
    assert "stock" not in same["scenarios"]["overflow_every_4"]


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
import unittest

import torch


class TrainerResumeFp16Test(unittest.TestCase):
    def test_resume_on_accelerator(self):
        for diff in DIFFS:
            with self.subTest(diff=diff):
                expected = {"model": {"w": torch.tensor([1.0, 2.0])}, "log": [{"loss": 0.5}]}
                actual = {"model": {"w": torch.tensor([1.0, 2.0 + diff])}, "log": [{"loss": 0.5}]}
                torch.testing.assert_close(actual, expected, rtol=0, atol=0)

    def test_not_selected(self):
        raise RuntimeError("must not run")
"""


def fake_parity_root(tmp_path, source):
    test_file = tmp_path / gpu_check.PARITY_TEST
    test_file.parent.mkdir(parents=True)
    test_file.write_text(source, encoding="utf-8")
    return str(tmp_path)


@without_cuda
def test_parity_after_cublas_measures_the_comparisons_of_the_parity_test(tmp_path):
    # A stand-in parity module (the real one skips without an accelerator): its comparisons are measured in-process
    root = fake_parity_root(tmp_path / "differs", "DIFFS = (0.0, 0.5)\n" + FAKE_PARITY)
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
    root = fake_parity_root(tmp_path / "equal", "DIFFS = (0.0, 0.0)\n" + FAKE_PARITY)
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["bit_exact"] is True
    assert result["max_abs_diff"] == 0.0
    assert result["status"] == "error"
    assert "warm-up did not pass" in result["reason"]
    assert "deterministic algorithms" in result["note"]  # the stand-in sets neither

    root = fake_parity_root(tmp_path / "broken", "raise ImportError('no such helper')\n")
    result = gpu_check.run_parity_after_cublas(root, [], 60)
    assert result["status"] == "error"
    assert "ImportError: no such helper" in result["reason"]
    assert result["bit_exact"] is None


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
