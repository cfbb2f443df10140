"""Tests for bench/gpu_check.py on CPU: the CUDA parts are skipped with a reason, the output is whole or absent."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("workbench_gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


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
    assert set(report["parts"]) == {"parity", "fused_skip_cost"}
    for part in report["parts"].values():
        assert part["status"] == "skipped"
        assert "nvidia-smi not found" in part["reason"]
    assert report["machine"]["torch"]["version"]
    for name in ("transformers", "accelerate"):
        assert "error" not in report["packages"][name], report["packages"][name]
        assert report["packages"][name]["file"].endswith(f"{name}/__init__.py")
    assert "same_as_patched" in report["packages"]["stock_accelerate"]
    summary = (out / "gpu_check.txt").read_text(encoding="utf-8")
    assert "parity: skipped - no NVIDIA GPU" in summary
    assert "fused_skip_cost: skipped" in summary
    assert 5 <= len(summary.splitlines()) <= 20


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
