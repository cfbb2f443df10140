"""Tests for utils/repro.py: its pure helpers, and one short end-to-end run against stock and fork (~30 s)."""

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("workbench_repro", REPO_ROOT / "utils" / "repro.py")
repro = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repro)


def test_encode_pads_and_truncates():
    ids, mask = repro.encode("ab", length=4)
    assert ids == [ord("a") + 1, ord("b") + 1, 0, 0]
    assert mask == [1, 1, 0, 0]
    ids, mask = repro.encode("é" * 10, length=4)  # bytes, not characters
    assert len(ids) == 4 and mask == [1, 1, 1, 1] and max(ids) <= 256


def test_prompts_are_shipped():
    prompts = repro.load_prompts()
    assert 24 <= len(prompts) <= 100
    assert all(prompt.strip() == prompt and prompt for prompt in prompts)


def test_probe_fields_take_the_logged_names_only_when_missing():
    stock = [{"loss": 1.0, "step": 1, "repro_loss_scale": 8192.0, "repro_num_skipped_updates": 2}]
    normalized, observed = repro.with_probe_fields(stock)
    assert observed
    assert normalized == [{"loss": 1.0, "step": 1, "loss_scale": 8192.0, "num_skipped_updates": 2}]
    fork = [{"loss": 1.0, "step": 1, "loss_scale": 4096.0, "num_skipped_updates": 1}]
    assert repro.with_probe_fields(fork) == (fork, False)


def _result(rows_a, rows_b, status="ok", messages=(), error=None):
    history_a = [{**row, "step": step} for step, row in rows_a.items()]
    history_b = [{**row, "step": step} for step, row in rows_b.items()]
    return {
        "status": status,
        "error": error,
        "messages": list(messages),
        "reference_rows": rows_a,
        "candidate_rows": rows_b,
        "comparison": repro.resume_diff.compare_histories(history_a, history_b),
        "lr_advanced_on_skipped_updates": repro.resume_diff.lr_advanced_on_skipped_updates(rows_b),
        "skipped_steps": [s for s in rows_b if repro.resume_diff.was_skipped(rows_b, s)],
    }


ROWS = {
    1: {"learning_rate": 1e-5, "loss": 5.0, "grad_norm": 1.0, "loss_scale": 8192.0, "num_skipped_updates": 0},
    2: {"learning_rate": 9e-6, "loss": 4.9, "grad_norm": 1.1, "loss_scale": 8192.0, "num_skipped_updates": 0},
}


def test_verdicts():
    assert repro.verdict("exact_resume", _result(ROWS, ROWS)) == "identical (2 steps, bit-exact)"
    crashed = _result(ROWS, {1: ROWS[1]}, status="crashed", error="AttributeError: boom")
    assert repro.verdict("bf16_resume", crashed) == "crashes: AttributeError: boom"
    reset = {1: ROWS[1], 2: {**ROWS[2], "grad_norm": float("inf"), "loss_scale": 32768.0, "num_skipped_updates": 1}}
    line = repro.verdict("no_scaler_pt", _result(ROWS, reset))
    assert line == "diverges at step 2 (grad_norm 1.1 -> inf; loss_scale_reset); says nothing about the loss scale"
    warned = _result(ROWS, reset, messages=["WARNING: The checkpoint /x/y/checkpoint-1 has no fp16 loss scaler state"])
    assert "says: WARNING: The checkpoint .../checkpoint-1 has no fp16 loss scaler state" in repro.verdict(
        "no_scaler_pt", warned
    )
    assert repro.fork_behaves_as_fixed("no_scaler_pt", warned)
    assert not repro.fork_behaves_as_fixed("no_scaler_pt", _result(ROWS, reset))


def test_ddp_verdicts():
    same = {**_result(ROWS, ROWS), "processes_hold_the_same_model": True}
    assert repro.verdict("ddp_exact_resume", same) == (
        "identical (2 steps, bit-exact); both processes hold the same model"
    )
    assert repro.fork_behaves_as_fixed("ddp_exact_resume", same)
    assert not repro.fork_behaves_as_fixed("ddp_exact_resume", {**same, "processes_hold_the_same_model": False})
    drifted = {**same, "processes_hold_the_same_model": False}
    assert not repro.fork_behaves_as_fixed("ddp_exact_resume", drifted)


def test_table_marks_the_first_divergence():
    reset = {1: ROWS[1], 2: {**ROWS[2], "loss_scale": 32768.0}}
    table = repro.format_table("no_scaler_pt", _result(ROWS, reset))
    lines = table.splitlines()
    assert "uninterrupted" in lines[0] and "resumed" in lines[0]
    assert lines[2].rstrip().endswith("|")  # step 1: nothing differs
    assert lines[3].endswith("| loss_scale  <- first divergence")
    assert "32768" in lines[3]


def test_end_to_end_stock_and_fork(tmp_path):
    out = tmp_path / "repro"
    # The single-process scenarios; the two-process ones (torchrun) are covered by `make repro` and the verdict tests.
    scenarios = ["exact_resume", "no_scaler_pt", "bf16_resume", "fused_skip"]
    command = [sys.executable, "utils/repro.py", "--steps", "6", "--resume-step", "3", "--out", str(out)]
    command += ["--scenarios", *scenarios]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "=== verdicts" in completed.stdout
    assert (out / "repro.png").stat().st_size > 10_000

    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["settings"]["steps"] == 6 and report["settings"]["resume_step"] == 3
    assert report["fork_as_expected"] is True
    assert "build/stock/src" in report["variants"]["stock"]["transformers_file"]
    assert "build/stock" not in report["variants"]["fork"]["transformers_file"]
    assert list(report["scenarios"]) == scenarios
    scenarios = report["scenarios"]
    stock = {name: entry["variants"]["stock"] for name, entry in scenarios.items()}
    fork = {name: entry["variants"]["fork"] for name, entry in scenarios.items()}

    assert fork["exact_resume"]["comparison"]["identical"]
    assert stock["exact_resume"]["comparison"]["identical"]  # stock 5.24 saves scaler.pt (#34932)

    for result in (stock["no_scaler_pt"], fork["no_scaler_pt"]):
        assert result["comparison"]["divergence"]["step"] == 4
        assert result["comparison"]["divergence"]["cause"] == "loss_scale_reset"
    assert stock["no_scaler_pt"]["loss_scale_observed_by_repro"]
    assert stock["no_scaler_pt"]["messages"] == []
    assert any("has no fp16 loss scaler state" in message for message in fork["no_scaler_pt"]["messages"])

    assert stock["bf16_resume"]["status"] == "crashed"
    assert stock["bf16_resume"]["verdict"].startswith("crashes: AttributeError")
    assert fork["bf16_resume"]["status"] == "ok"
    assert fork["bf16_resume"]["comparison"]["divergence"]["cause"] == "precision_changed"

    assert stock["fused_skip"]["lr_advanced_on_skipped_updates"]
    assert stock["fused_skip"]["comparison"]["divergence"]["cause"] == "lr_advanced_on_skipped_update"
    assert fork["fused_skip"]["skipped_steps"] and not fork["fused_skip"]["lr_advanced_on_skipped_updates"]
    assert fork["fused_skip"]["comparison"]["identical"]


def test_overflow_steps_default_to_the_middle_of_the_schedule():
    assert repro.parse_args([]).overflow_steps == [9, 10]
    assert repro.parse_args(["--steps", "6", "--resume-step", "3"]).overflow_steps == [2, 3]
    assert repro.parse_args(["--steps", "2", "--resume-step", "1"]).overflow_steps == [1]
    assert repro.parse_args(["--overflow-steps", " 12,3,12 "]).overflow_steps == [3, 12]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--overflow-steps", "21"], "--overflow-steps: steps between 1 and --steps (20) expected, got '21'"),
        (["--overflow-steps", "0,5"], "--overflow-steps: steps between 1 and --steps (20) expected, got '0,5'"),
        (["--overflow-steps", ","], "--overflow-steps: steps between 1 and --steps (20) expected, got ','"),
        (["--overflow-steps", "a,b"], "--overflow-steps: comma-separated step numbers expected, got 'a,b'"),
        (["--steps", "1"], "--steps must be at least 2"),
        (["--steps", "5", "--resume-step", "5"], "--resume-step must be at least 1 and less than --steps"),
        (["--variants", "stock,beta"], "--variants: choose among stock, fork"),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        repro.parse_args(argv)
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_duplicate_variants_run_once():
    assert repro.parse_args(["--variants", "fork, fork,stock"]).variants == ["fork", "stock"]


def test_out_that_cannot_be_created_is_a_setup_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        repro.main(["--variants", "fork", "--out", str(blocker / "repro")])
    assert exit_info.value.code == 2
    assert f"repro: error: --out {blocker / 'repro'}: cannot create the output directory" in capsys.readouterr().err


def test_missing_stock_src_is_a_setup_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        repro.main(["--stock-src", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "needs transformers/__init__.py" in capsys.readouterr().err


def test_a_failed_worker_stops_the_others(tmp_path, monkeypatch, capsys):
    """The first worker fails at once while the second would run for a minute: it must be killed, not left running."""
    commands = {
        "stock": [sys.executable, "-c", "raise SystemExit(3)"],
        "fork": [sys.executable, "-c", "import time; time.sleep(60)"],
    }
    started = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(repro, "_worker_command", lambda variant, options: commands[variant])
    monkeypatch.setattr(repro.subprocess, "Popen", RecordingPopen)
    options = repro.parse_args(["--out", str(tmp_path), "--stock-src", str(tmp_path / "stock")])
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        repro.run_workers(options)
    assert exit_info.value.code == 2
    assert "the stock worker failed (exit status 3)" in capsys.readouterr().err
    assert len(started) == 2
    assert [process.returncode for process in started] == [3, -signal.SIGKILL]  # reaped, nothing left running
    assert time.monotonic() - start < 30


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process's thread names from /proc")
@pytest.mark.parametrize("imports_first", [True, False], ids=["worker-order", "imported-after-init"])
def test_destroying_the_ddp_workers_process_group_stops_its_gloo_threads(tmp_path, imports_first):
    """
    Issue 23: `torch.distributed.nn.functional`, imported while a default group exists, holds it in its functions'
    defaults, so that `destroy_process_group()` cannot free it and its gloo threads run on until interpreter exit
    (where a process sometimes aborted). The DDP worker imports it, and transformers, before creating the group.
    One process, a group of one, in a fresh interpreter that ends with os._exit (the second case is the bug).
    """
    script = f"""
import gc, os, sys
sys.path.insert(0, {str(REPO_ROOT / "utils")!r})
import torch.distributed as dist
import repro
if {imports_first}:
    repro._import_before_process_group()
dist.init_process_group("gloo", init_method={(tmp_path / "store").as_uri()!r}, rank=0, world_size=1)
import torch.distributed.nn
before = [name for name in repro._thread_names() if "gloo" in name]
gc.collect()
dist.destroy_process_group()
print(len(before), [name for name in repro._thread_names() if "gloo" in name], flush=True)
os._exit(0)
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    threads_before, threads_after = completed.stdout.split(maxsplit=1)
    assert int(threads_before) > 0
    if imports_first:
        assert threads_after.strip() == "[]"
    else:
        assert "pt_gloo_runloop" in threads_after
