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
    warned = _result(
        ROWS, reset, messages=["WARNING: No scaler.pt in /x/y/checkpoint-1: the fp16 loss scale restarts at 65536.0"]
    )
    assert "says: WARNING: No scaler.pt in .../checkpoint-1: the fp16 loss scale restarts at 65536.0" in repro.verdict(
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
    assert any(repro.MISSING_SCALER_WARNING in message for message in fork["no_scaler_pt"]["messages"])

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


# What torchrun prints when one process aborts (abridged; here rank 1 called os.abort() after a `terminate called` line,
# as a process of issue 23 aborted at exit after its work): the root cause block names the rank and the signal.
TORCHRUN_ABORT_OUTPUT = """\
[fork] ddp/exact_resume: done in 0.74 s
terminate called without an active exception
W1201 19:46:26.055000 7689 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7692 closing signal \
SIGTERM
E1201 19:46:26.056000 7689 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 1 \
(pid: 7693) of binary: python
Traceback (most recent call last):
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
utils/repro.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_19:46:26
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7692)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7692
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_19:46:26
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 7693)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 7693
======================================================
"""


def test_torchrun_root_cause_and_last_error_line():
    lines = TORCHRUN_ABORT_OUTPUT.splitlines()
    assert repro.torchrun_root_cause(lines) == "rank 1 exited with -6 (SIGABRT)"
    assert repro.last_error_line(lines) == "terminate called without an active exception"
    assert repro.torchrun_root_cause(
        ["Root Cause (first observed failure):", "[0]:", "  rank : 0", "  exitcode : 1"]
    ) == ("rank 0 exited with 1")
    python_error = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "[rank1]: ValueError: Cannot resume",
    ]
    assert repro.last_error_line(python_error) == "[rank1]: ValueError: Cannot resume"
    assert repro.torchrun_root_cause(["no block"]) is None
    assert repro.last_error_line(["[fork] ddp: running 2 processes ..."]) is None


def _write_script(path, text):
    path.write_text(text, encoding="utf-8")
    return [sys.executable, str(path)]


def test_a_failed_ddp_launch_is_a_crashed_run_with_its_root_cause(tmp_path, monkeypatch, capsys):
    """A fake torchrun prints what torchrun did when a process aborted at exit, after the results were written."""
    base = tmp_path / "fork"
    fake = _write_script(
        tmp_path / "fake_torchrun.py",
        "import json, os, sys\n"
        f"os.makedirs({str(base / 'ddp')!r})\n"
        f"json.dump({{}}, open({str(base / 'ddp' / 'ddp.json')!r}, 'w'))\n"
        f"sys.stdout.write({TORCHRUN_ABORT_OUTPUT!r})\n"
        "raise SystemExit(1)\n",
    )
    monkeypatch.setattr(repro, "_ddp_command", lambda variant, options, port: fake)
    (base / "ddp").mkdir(parents=True)
    (base / "ddp" / "stale").write_text("", encoding="utf-8")  # an earlier launch's: removed before this one
    options = repro.parse_args(["--out", str(tmp_path), "--scenarios", "ddp_exact_resume"])
    runs = repro._launch_ddp_runs("fork", options, str(base))
    assert not (base / "ddp" / "stale").exists()
    assert list(runs) == ["ddp/uninterrupted"]
    record = runs["ddp/uninterrupted"]
    assert record["status"] == "crashed" and record["dir"] is None and record["process_failed"]
    assert record["error"] == (
        "the two-process run failed (torchrun exit status 1; root cause: rank 1 exited with -6 (SIGABRT); last error: "
        "terminate called without an active exception; the results had been written)"
    )
    assert "terminate called without an active exception" in capsys.readouterr().out  # the output is shown live

    worker = {"transformers_file": "fork/transformers/__init__.py", "runs": runs}
    result = repro.compare_variant("ddp_exact_resume", worker)  # no TypeError on the run without a directory
    assert result["verdict"] == f"crashed: {record['error']}"
    assert not result["behaves_as_fixed"]
    assert result["reference_rows"] == {} and result["candidate_rows"] == {}


def test_a_worker_that_dies_becomes_crashed_runs_and_the_other_finishes(tmp_path, monkeypatch, capsys):
    fork_results = {"variant": "fork", "transformers_file": "/fork/transformers/__init__.py", "device": "cpu"}
    fork_results |= {"transformers_version": "5.24.0", "torch_version": "2", "runs": {}}
    (tmp_path / "fork").mkdir()
    commands = {
        "stock": _write_script(
            tmp_path / "stock.py", "import sys\nprint('RuntimeError: boom', file=sys.stderr)\nraise SystemExit(3)\n"
        ),
        "fork": _write_script(
            tmp_path / "fork.py",
            "import json, time\ntime.sleep(1)\n"
            f"json.dump({fork_results!r}, open({str(tmp_path / 'fork' / 'worker.json')!r}, 'w'))\n",
        ),
    }
    monkeypatch.setattr(repro, "_worker_command", lambda variant, options: commands[variant])
    options = repro.parse_args(["--out", str(tmp_path), "--stock-src", str(tmp_path / "stock")])
    workers = repro.run_workers(options)
    assert workers["fork"] == fork_results
    stock = workers["stock"]
    assert stock["transformers_file"] is None
    expected_runs = {name for scenario in repro.SCENARIOS.values() for name in scenario[1:3]}
    assert set(stock["runs"]) == expected_runs
    why = "the stock worker failed (exit status 3); last error: RuntimeError: boom"
    assert all(
        run == {"dir": None, "status": "crashed", "error": why, "process_failed": True}
        for run in stock["runs"].values()
    )
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and f"repro: {why}" in err


def test_an_exception_in_the_driver_kills_the_workers(tmp_path, monkeypatch):
    """The first worker ends at once, the second would run for a minute: it is killed when the driver fails."""
    commands = {
        "stock": [sys.executable, "-c", "raise SystemExit(3)"],
        "fork": [sys.executable, "-c", "import time; time.sleep(60)"],
    }
    started = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(repro, "_worker_command", lambda variant, options: commands[variant])
    monkeypatch.setattr(repro, "_read_worker_results", interrupted)
    monkeypatch.setattr(repro.subprocess, "Popen", RecordingPopen)
    options = repro.parse_args(["--out", str(tmp_path), "--stock-src", str(tmp_path / "stock")])
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        repro.run_workers(options)
    assert len(started) == 2
    assert [process.returncode for process in started] == [3, -signal.SIGKILL]  # reaped, nothing left running
    assert time.monotonic() - start < 30


def _fake_worker(tmp_path, variant, crashed=()):
    """Worker results whose runs are tiny trainer_state.json files; the runs named in `crashed` died with a launch."""
    runs = {}
    for scenario in repro.SCENARIOS.values():
        for name in scenario[1:3]:
            if name in crashed:
                runs[name] = repro._failed_run("the two-process run failed (boom)")
                continue
            history = [{**row, "step": step} for step, row in ROWS.items()]
            run_dir = tmp_path / variant / name
            run_dir.mkdir(parents=True, exist_ok=True)  # a reference shared by several scenarios
            (run_dir / "trainer_state.json").write_text(json.dumps({"log_history": history}), encoding="utf-8")
            runs[name] = {"dir": str(run_dir), "status": "ok", "error": None, "messages": [], "other_warnings": []}
            if name == "no_scaler_pt":
                runs[name]["messages"] = [f"WARNING: Checkpoint {run_dir} {repro.MISSING_SCALER_WARNING}"]
            if name.startswith("ddp/"):
                runs[name]["processes_hold_the_same_model"] = True
    transformers_file = str(tmp_path / variant / "transformers" / "__init__.py")
    return {"variant": variant, "transformers_file": transformers_file, "transformers_version": "5.24.0"} | {
        "torch_version": "2",
        "device": "cpu",
        "runs": runs,
    }


@pytest.mark.parametrize(("crashed_variant", "exit_status"), [("fork", 1), ("stock", 0)])
def test_a_crashed_scenario_is_its_verdict_and_everything_else_is_written(
    tmp_path, monkeypatch, capsys, crashed_variant, exit_status
):
    stock_src = tmp_path / "stock_src"
    for package in ("transformers", "accelerate"):
        (stock_src / package).mkdir(parents=True)
        (stock_src / package / "__init__.py").write_text("", encoding="utf-8")
    crashed = ("ddp/uninterrupted",)
    workers = {
        variant: _fake_worker(tmp_path / "runs", variant, crashed if variant == crashed_variant else ())
        for variant in ("stock", "fork")
    }
    monkeypatch.setattr(repro, "run_workers", lambda options: workers)
    out = tmp_path / "out"
    assert repro.main(["--out", str(out), "--stock-src", str(stock_src)]) == exit_status
    printed = capsys.readouterr().out
    assert f"ddp_exact_resume {crashed_variant:5s}: crashed: the two-process run failed (boom)" in printed
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert list(report["scenarios"]) == list(repro.SCENARIOS)
    for scenario, entry in report["scenarios"].items():
        for variant, result in entry["variants"].items():
            lost = scenario == "ddp_exact_resume" and variant == crashed_variant
            assert result["status"] == ("crashed" if lost else "ok"), (scenario, variant)
            if not lost:
                assert result["comparison"]["identical"] and len(result["reference_rows"]) == 2
    assert report["scenarios"]["ddp_exact_resume"]["variants"][crashed_variant]["verdict"] == (
        "crashed: the two-process run failed (boom)"
    )
    assert report["fork_as_expected"] is (crashed_variant != "fork")
    assert (out / "repro.png").stat().st_size > 10_000


def gloo_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process's thread names from /proc")
@pytest.mark.skipif(not gloo_available(), reason="this torch build has no gloo backend (torch.distributed)")
@pytest.mark.parametrize("imports_first", [True, False], ids=["worker-order", "imported-after-init"])
def test_destroying_the_ddp_workers_process_group_stops_its_gloo_threads(tmp_path, imports_first):
    """
    Issue 23: `torch.distributed.nn.functional`, imported while a default group exists, holds it in its functions'
    defaults, so that `destroy_process_group()` cannot free it and its gloo threads run on until interpreter exit
    (where a process sometimes aborted). The DDP worker imports it, and transformers, before creating the group.
    One process, a group of one, in a fresh interpreter that ends with os._exit (the second case is the bug).
    """
    script = f"""
import gc, os, sys, time
sys.path.insert(0, {str(REPO_ROOT / "utils")!r})
import torch.distributed as dist
import repro
if {imports_first}:
    repro._import_before_process_group()
dist.init_process_group("gloo", init_method={(tmp_path / "store").as_uri()!r}, rank=0, world_size=1)
import torch.distributed.nn
# gloo's threads name themselves once running: on a loaded machine, right after init some are still unnamed
deadline = time.monotonic() + 60
while "pt_gloo_runloop" not in repro._thread_names() and time.monotonic() < deadline:
    time.sleep(0.01)
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
