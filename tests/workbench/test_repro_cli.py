"""
Tests for utils/repro/cli.py: the options and setup errors, a run with a crashed scenario, and one short end-to-end run
against stock and fork (~30 s).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import cli, launch, scenarios, verdicts  # noqa: E402
from repro_testing import ROWS  # noqa: E402


def test_end_to_end_stock_and_fork(tmp_path):
    out = tmp_path / "repro"
    # The single-process scenarios; the two-process ones (torchrun) are covered by `make repro` and the verdict tests.
    scenarios = ["exact_resume", "no_scaler_pt", "bf16_resume", "fused_skip"]
    command = [sys.executable, "utils/repro", "--steps", "6", "--resume-step", "3", "--out", str(out)]
    command += ["--scenarios", *scenarios]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "=== verdicts" in completed.stdout
    assert (out / "repro.png").stat().st_size > 10_000

    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["settings"]["steps"] == 6 and report["settings"]["resume_step"] == 3
    assert report["fork_as_expected"] is True
    for package in ("transformers", "accelerate"):
        assert "build/stock/src" in report["variants"]["stock"][f"{package}_file"]
        assert "build/stock" not in report["variants"]["fork"][f"{package}_file"]
        for variant in ("stock", "fork"):  # the fork is at the pinned release too
            assert report["variants"][variant][f"{package}_version"] == PINNED[package]
            assert f"{variant:5s}: transformers {PINNED['transformers']}, accelerate {PINNED['accelerate']}" in (
                completed.stdout
            )
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
    assert any(verdicts.MISSING_SCALER_WARNING in message for message in fork["no_scaler_pt"]["messages"])
    assert all(m.startswith("INFO: ") for m in fork["no_scaler_pt"]["messages"])  # as the repro docstring says

    assert stock["bf16_resume"]["status"] == "crashed"
    assert stock["bf16_resume"]["verdict"].startswith("crashes: AttributeError")
    assert fork["bf16_resume"]["status"] == "ok"
    assert fork["bf16_resume"]["comparison"]["divergence"]["cause"] == "precision_changed"

    assert stock["fused_skip"]["lr_advanced_on_skipped_updates"]
    assert stock["fused_skip"]["comparison"]["divergence"]["cause"] == "lr_advanced_on_skipped_update"
    assert fork["fused_skip"]["skipped_steps"] and not fork["fused_skip"]["lr_advanced_on_skipped_updates"]
    assert fork["fused_skip"]["comparison"]["identical"]


def test_overflow_steps_default_to_the_middle_of_the_schedule():
    assert cli.parse_args([]).overflow_steps == [9, 10]
    assert cli.parse_args(["--steps", "6", "--resume-step", "3"]).overflow_steps == [2, 3]
    assert cli.parse_args(["--steps", "2", "--resume-step", "1"]).overflow_steps == [1]


def test_the_resume_step_follows_the_number_of_steps():
    """`--steps 6` alone (make help's example) was refused: the checkpoint to resume from stayed 11."""
    assert [cli.parse_args(["--steps", str(steps)]).resume_step for steps in (20, 6, 2)] == [11, 4, 1]
    assert cli.parse_args(["--overflow-steps", " 12,3,12 "]).overflow_steps == [3, 12]


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
        cli.parse_args(argv)
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_duplicate_variants_run_once():
    assert cli.parse_args(["--variants", "fork, fork,stock"]).variants == ["fork", "stock"]


def test_out_that_cannot_be_created_is_a_setup_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--variants", "fork", "--out", str(blocker / "repro")])
    assert exit_info.value.code == 2
    assert f"repro: error: --out {blocker / 'repro'}: cannot create the output directory" in capsys.readouterr().err


def test_device_cuda_without_cuda_is_refused_up_front(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "utils/repro", "--device", "cuda", "--out", str(out)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device on any machine
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert (
        completed.stderr == "repro: error: --device cuda: torch sees no CUDA device here (use --device cpu, or auto)\n"
    )
    assert not out.exists()


PINNED = {
    entry["package"]: entry["version"]
    for entry in json.loads((REPO_ROOT / "patches/config.json").read_text(encoding="utf-8"))["upstreams"].values()
}


def fake_stock_src(path: Path, versions: dict[str, str]) -> Path:
    for package, version in versions.items():
        (path / package).mkdir(parents=True)
        (path / package / "__init__.py").write_text(f'__version__ = "{version}"\n', encoding="utf-8")
    return path


def test_missing_stock_src_is_a_setup_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--stock-src", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "holds transformers (none), accelerate (none), not the pinned" in capsys.readouterr().err


def test_a_stock_src_of_other_versions_is_refused(tmp_path, capsys):
    stock_src = fake_stock_src(tmp_path / "stock", {**PINNED, "accelerate": "0.1.0"})
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--stock-src", str(stock_src), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    pinned = ", ".join(f"{package} {version}" for package, version in PINNED.items())
    assert f"holds accelerate 0.1.0, not the pinned {pinned}" in capsys.readouterr().err


def _fake_worker(tmp_path, variant, crashed=()):
    """Worker results whose runs are tiny trainer_state.json files; the runs named in `crashed` died with a launch."""
    runs = {}
    for scenario in scenarios.SCENARIOS.values():
        for name in scenario[1:3]:
            if name in crashed:
                runs[name] = launch.failed_run("the two-process run failed (boom)")
                continue
            history = [{**row, "step": step} for step, row in ROWS.items()]
            run_dir = tmp_path / variant / name
            run_dir.mkdir(parents=True, exist_ok=True)  # a reference shared by several scenarios
            (run_dir / "trainer_state.json").write_text(json.dumps({"log_history": history}), encoding="utf-8")
            runs[name] = {"dir": str(run_dir), "status": "ok", "error": None, "messages": [], "other_warnings": []}
            if name == "no_scaler_pt":
                runs[name]["messages"] = [f"WARNING: Checkpoint {run_dir} {verdicts.MISSING_SCALER_WARNING}"]
            if name.startswith("ddp/"):
                runs[name]["processes_hold_the_same_model"] = True
    transformers_file = str(tmp_path / variant / "transformers" / "__init__.py")
    versions = {"transformers_version": PINNED["transformers"], "accelerate_version": PINNED["accelerate"]}
    return {"variant": variant, "transformers_file": transformers_file, **versions} | {
        "torch_version": "2",
        "device": "cpu",
        "runs": runs,
    }


@pytest.mark.parametrize(("crashed_variant", "exit_status"), [("fork", 1), ("stock", 0)])
def test_a_crashed_scenario_is_its_verdict_and_everything_else_is_written(
    tmp_path, monkeypatch, capsys, crashed_variant, exit_status
):
    stock_src = fake_stock_src(tmp_path / "stock_src", PINNED)
    crashed = ("ddp/uninterrupted",)
    workers = {
        variant: _fake_worker(tmp_path / "runs", variant, crashed if variant == crashed_variant else ())
        for variant in ("stock", "fork")
    }
    monkeypatch.setattr(cli, "run_workers", lambda options: workers)
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), "--stock-src", str(stock_src)]) == exit_status
    printed = capsys.readouterr().out
    assert f"ddp_exact_resume {crashed_variant:5s}: crashed: the two-process run failed (boom)" in printed
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert list(report["scenarios"]) == list(scenarios.SCENARIOS)
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


def _previous_run(out: Path) -> dict:
    """A previous run's files under `out`; returns {relative path: content}."""
    files = {"report.json": '{"previous": true}', "repro.png": "png", "fork/uninterrupted/trainer_state.json": "{}"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text, encoding="utf-8")
    return files


def _files(out: Path) -> dict:
    return {str(p.relative_to(out)): p.read_text(encoding="utf-8") for p in out.rglob("*") if p.is_file()}


def test_a_new_run_replaces_the_previous_one_only_when_complete(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    previous = _previous_run(out)
    stock_src = fake_stock_src(tmp_path / "stock_src", PINNED)
    seen = {}

    def fake_workers(options):
        seen["out"] = options.out  # the workers write beside the previous run, which stays whole meanwhile
        seen["previous"] = _files(out)
        workers = {variant: _fake_worker(Path(options.out), variant) for variant in ("stock", "fork")}
        for record in ("fork/worker.json", "fork/ddp/ddp.json"):  # the workers' records name the new run's folders
            (Path(options.out) / record).parent.mkdir(parents=True, exist_ok=True)
            (Path(options.out) / record).write_text(json.dumps(workers["fork"]["runs"]), encoding="utf-8")
        return workers

    monkeypatch.setattr(cli, "run_workers", fake_workers)
    assert cli.main(["--out", str(out), "--stock-src", str(stock_src)]) == 0
    assert seen == {"out": str(out) + cli.PARTIAL_SUFFIX, "previous": previous}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "stock_src"]  # nothing beside it is left
    report = (out / "report.json").read_text(encoding="utf-8")
    assert "previous" not in report and str(out / "fork" / "no_scaler_pt") in report  # its paths are the final ones
    assert cli.PARTIAL_SUFFIX not in report
    for record in ("fork/worker.json", "fork/ddp/ddp.json"):
        text = (out / record).read_text(encoding="utf-8")
        assert str(out / "fork" / "no_scaler_pt") in text and cli.PARTIAL_SUFFIX not in text, text
    assert (out / "fork" / "no_scaler_pt" / "trainer_state.json").is_file()
    printed = capsys.readouterr().out
    python = (
        os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
    )
    assert f"compare any two runs: {python} " in printed  # a command that runs as printed, not a bare `python`


def test_ctrl_c_leaves_the_previous_run_whole(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    previous = _previous_run(out)

    def interrupted(options):
        Path(options.out, "fork", "uninterrupted").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_workers", interrupted)
    assert cli.main(["--out", str(out), "--variants", "fork"]) == 130
    assert _files(out) == previous
    assert [path.name for path in tmp_path.iterdir()] == ["out"]
    err = capsys.readouterr().err
    assert err.strip() == (
        f"repro: interrupted: the unfinished run was removed; the previous run in {out} (report.json, repro.png, run "
        "folders) is unchanged. Run `make repro` again."
    )


def test_an_out_holding_other_files_is_not_replaced(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--out", str(tmp_path), "--variants", "fork"])
    assert exit_info.value.code == 2
    assert f"--out {tmp_path} holds other files than a repro run's" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_ctrl_c_in_a_real_run_stops_every_process_without_a_traceback(tmp_path):
    """SIGINT to the process group, as Ctrl-C sends it, while the worker trains: one line, status 130."""
    out = tmp_path / "out"
    previous = _previous_run(out)
    command = [sys.executable, "utils/repro", "--variants", "fork", "--scenarios", "exact_resume", "--steps", "20"]
    process = subprocess.Popen(
        [*command, "--out", str(out)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        for line in process.stdout:  # the worker has imported torch and transformers and trains
            if "[fork] uninterrupted: running" in line:
                break
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr and "KeyboardInterrupt" not in stdout + stderr
    assert [line for line in stderr.splitlines() if line.strip()][-1].startswith(
        "repro: interrupted: the unfinished run"
    )
    assert _files(out) == previous
    assert [path.name for path in tmp_path.iterdir()] == ["out"]
