"""Tests for utils/resume_diff.py on synthetic trainer_state.json files."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("workbench_resume_diff", REPO_ROOT / "utils" / "resume_diff.py")
resume_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resume_diff)

LRS = [1e-5, 9.5e-6, 8.2e-6, 6.3e-6, 4.1e-6, 2.0e-6]


def make_history(steps=6, loss_scale=8192.0, skipped=0, changes=None):
    """A fork-style log history: one entry per step (`changes` overrides fields per step), then the summary."""
    history = []
    for step in range(1, steps + 1):
        entry = {
            "loss": 5.0 - step / 10,
            "grad_norm": 1.0 + step / 100,
            "learning_rate": LRS[step - 1],
            "epoch": step / 12,
            "step": step,
        }
        if loss_scale is not None:
            entry.update(grad_scale=loss_scale, num_skipped_updates=skipped)
        entry.update((changes or {}).get(step, {}))
        history.append(entry)
    history.append(
        {
            "train_runtime": 1.5,
            "train_samples_per_second": 10.0,
            "train_steps_per_second": 2.0,
            "train_loss": 4.7,
            "total_flos": 123.0,
            "epoch": steps / 12,
            "step": steps,
        }
    )
    return history


def write_state(path: Path, history) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"global_step": 6, "log_history": history}), encoding="utf-8")
    return path


def compare(history_a, history_b, **kwargs):
    return resume_diff.compare_histories(history_a, history_b, **kwargs)


def test_identical(tmp_path, capsys):
    a = write_state(tmp_path / "a" / "trainer_state.json", make_history())
    b = write_state(tmp_path / "b" / "trainer_state.json", make_history())
    assert resume_diff.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "identical" in out
    assert "compared 6 logged steps" in out


def test_timing_fields_and_summary_are_ignored():
    history_b = make_history()
    history_b[-1].update(train_runtime=99.0, train_samples_per_second=1.0, train_loss=3.3, total_flos=1.0)
    history_b[2]["train_steps_per_second"] = 7.0  # a timing field inside a step entry
    history_a = make_history()
    history_a.insert(3, {"eval_loss": 4.0, "eval_runtime": 0.1, "eval_samples_per_second": 5.0, "step": 3})
    history_b.insert(3, {"eval_loss": 4.0, "eval_runtime": 0.9, "eval_samples_per_second": 1.0, "step": 3})
    result = compare(history_a, history_b)
    assert result["identical"], result["divergence"]
    assert "eval_loss" in result["fields_compared"]
    assert not any(name.endswith(("_runtime", "_per_second")) for name in result["fields_compared"])


def test_diverged_loss_is_data_or_rng(tmp_path, capsys):
    a = write_state(tmp_path / "a.json", make_history())
    b = write_state(tmp_path / "b.json", make_history(changes={4: {"loss": 9.0}, 5: {"loss": 9.5}}))
    assert resume_diff.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "first divergence at step 4:" in out
    assert "loss: A=4.6  B=9.0" in out
    assert "data_or_rng" in out


def test_fields_listed_in_causal_order():
    history_b = make_history(changes={3: {"loss": 1.0, "grad_norm": 7.0, "epoch": 9.0}})
    divergence = compare(make_history(), history_b)["divergence"]
    assert [d["field"] for d in divergence["fields"]] == ["loss", "grad_norm", "epoch"]


def test_loss_scale_reset():
    resumed = make_history(changes={4: {"grad_scale": 32768.0, "num_skipped_updates": 1, "grad_norm": math.nan}})
    divergence = compare(make_history(), resumed)["divergence"]
    assert divergence["step"] == 4
    assert divergence["fields"][0] == {"field": "grad_norm", "a": 1.04, "b": resumed[3]["grad_norm"]}
    assert divergence["cause"] == "loss_scale_reset"
    assert "8192 to 32768" in divergence["explanation"]


def test_loss_scale_reset_without_logged_loss_scale():
    """Stock Trainers log no grad_scale: an overflow in one run only points to the reset."""
    resumed = make_history(loss_scale=None, changes={4: {"grad_norm": math.inf}})
    divergence = compare(make_history(loss_scale=None), resumed)["divergence"]
    assert divergence["cause"] == "loss_scale_reset"
    assert "B's gradients overflowed at step 4" in divergence["explanation"]


def test_lr_advanced_on_skipped_update():
    skipped = {2: {"grad_norm": math.inf, "num_skipped_updates": 1}}
    held = make_history(changes={**skipped, 3: {"learning_rate": LRS[1]}})  # the LR waits for a real update
    for step in range(3, 7):
        held[step - 1]["num_skipped_updates"] = 1
        held[step - 1]["learning_rate"] = LRS[step - 2]
    advanced = make_history(changes=skipped)
    for step in range(3, 7):
        advanced[step - 1]["num_skipped_updates"] = 1
    assert resume_diff.lr_advanced_on_skipped_updates(resume_diff.step_rows(held)) == []
    assert resume_diff.lr_advanced_on_skipped_updates(resume_diff.step_rows(advanced)) == [2]
    divergence = compare(held, advanced)["divergence"]
    assert divergence["step"] == 3
    assert divergence["fields"][0]["field"] == "learning_rate"
    assert divergence["cause"] == "lr_advanced_on_skipped_update"
    assert "in B, the update of step 2 was skipped" in divergence["explanation"]


def test_skipped_update_detected_from_grad_norm_without_counter():
    rows = resume_diff.step_rows(make_history(loss_scale=None, changes={2: {"grad_norm": math.nan}}))
    assert [step for step in rows if resume_diff.was_skipped(rows, step)] == [2]
    assert resume_diff.lr_advanced_on_skipped_updates(rows) == [2]


def test_precision_changed():
    bf16 = make_history()
    for entry in bf16[3:6]:
        del entry["grad_scale"], entry["num_skipped_updates"]
        entry["loss"] += 0.01
    divergence = compare(make_history(), bf16)["divergence"]
    assert divergence["step"] == 4
    assert {"field": "grad_scale", "a": 8192.0, "b": resume_diff.MISSING} in divergence["fields"]
    assert divergence["cause"] == "precision_changed"


def test_a_field_logged_by_one_run_only_is_named_and_never_a_cause(tmp_path, capsys):
    """A stock run (the repro's probe records `repro_grad_scale`) against the fork (which logs `grad_scale`): lr, loss
    and grad_norm match at every step, so the runs are identical in what both log."""
    stock = make_history()
    for entry in stock[:-1]:
        entry["repro_grad_scale"] = entry.pop("grad_scale")
    a = write_state(tmp_path / "stock.json", stock)
    b = write_state(tmp_path / "fork.json", make_history())
    assert resume_diff.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "not compared, logged by A only: repro_grad_scale" in out
    assert "not compared, logged by B only: grad_scale" in out
    assert "identical: every logged step matches" in out
    result = compare(stock, make_history())
    assert (result["only_in_a"], result["only_in_b"]) == (["repro_grad_scale"], ["grad_scale"])
    assert "grad_scale" not in result["fields_compared"]
    # A real difference is still found, and its cause is not the one-sided field
    divergence = compare(stock, make_history(changes={4: {"loss": 9.0}}))["divergence"]
    assert [d["field"] for d in divergence["fields"]] == ["loss"]
    assert divergence["cause"] == "data_or_rng"


def test_run_incomplete():
    divergence = compare(make_history(), make_history(steps=3))["divergence"]
    assert divergence["step"] == 4
    assert divergence["cause"] == "run_incomplete"
    assert "its last one is step 3" in divergence["explanation"]


def test_unrecognized_cause():
    divergence = compare(make_history(), make_history(changes={2: {"epoch": 0.5}}))["divergence"]
    assert divergence["cause"] is None and divergence["explanation"] is None


def test_rtol_and_nan():
    history_a = make_history(changes={2: {"grad_norm": math.nan}})
    history_b = make_history(changes={2: {"grad_norm": math.nan}, 3: {"loss": 4.7 * (1 + 1e-9)}})
    assert not compare(history_a, history_b)["identical"]
    assert compare(history_a, history_b, rtol=1e-6)["identical"]


def test_run_directory_uses_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    write_state(run / "checkpoint-9" / "trainer_state.json", make_history(steps=5))
    write_state(run / "checkpoint-10" / "trainer_state.json", make_history())
    (run / "checkpoint-11").mkdir()  # no trainer_state.json: not a usable checkpoint
    history, source = resume_diff.load_log_history(str(run))
    assert source == str(run / "checkpoint-10" / "trainer_state.json")
    assert len(resume_diff.step_rows(history)) == 6
    write_state(run / "trainer_state.json", make_history(steps=2))
    assert resume_diff.load_log_history(str(run))[1] == str(run / "trainer_state.json")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file or directory"),
        ("{not json", "invalid JSON"),
        ('{"global_step": 3}', "no 'log_history' key"),
        ('{"log_history": {"step": 1}}', "'log_history' must be a list of objects"),
        ("[1, 2]", "no 'log_history' key"),
    ],
)
def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, content, expected):
    good = write_state(tmp_path / "good.json", make_history())
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content, encoding="utf-8")
    assert resume_diff.main([str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err
    assert expected in err


def test_directory_without_checkpoints(tmp_path, capsys):
    empty = tmp_path / "empty_run"
    (empty / "checkpoint-3").mkdir(parents=True)
    good = write_state(tmp_path / "good.json", make_history())
    assert resume_diff.main([str(empty), str(good)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err
    assert "no trainer_state.json and no checkpoint-N/trainer_state.json" in err


def test_json_output(tmp_path, capsys):
    a = write_state(tmp_path / "a.json", make_history())
    b = write_state(tmp_path / "b.json", make_history(changes={5: {"grad_norm": math.inf}}))
    assert resume_diff.main([str(a), str(b), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)  # strict JSON: inf is a string
    assert report["a"] == str(a) and report["identical"] is False
    assert report["divergence"]["step"] == 5
    assert report["divergence"]["fields"] == [{"field": "grad_norm", "a": 1.05, "b": "inf"}]
    assert report["divergence"]["cause"] == "loss_scale_reset"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"loss": 1.0, "step": "x"}, "log_history entry 1: 'step' must be an integer, got 'x'"),
        ({"loss": 1.0, "step": None}, "log_history entry 1: 'step' must be an integer, got None"),
        ({"loss": 1.0, "step": 2.5}, "log_history entry 1: 'step' must be an integer, got 2.5"),
        ({"loss": 1.0, "step": True}, "log_history entry 1: 'step' must be an integer, got True"),
        (
            {"loss": 1.0, "step": 2, "num_skipped_updates": "1"},
            "log_history entry 1: 'num_skipped_updates' must be a number, got '1'",
        ),
        (3, "'log_history' must be a list of objects (entry 1 is not)"),
    ],
)
def test_malformed_entry_exits_2_naming_the_file_and_entry(tmp_path, capsys, entry, expected):
    history = make_history()
    history[1] = entry
    good = write_state(tmp_path / "good.json", make_history())
    bad = write_state(tmp_path / "bad.json", history)
    assert resume_diff.main([str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{bad}: {expected}" in err


@pytest.mark.parametrize(
    "history", [[], [{"train_runtime": 1.0, "train_loss": 4.0, "step": 6}], [{"loss": 1.0}]], ids=str
)
def test_history_without_step_entries_is_bad_input(tmp_path, capsys, history):
    good = write_state(tmp_path / "good.json", make_history())
    bad = write_state(tmp_path / "bad.json", history)
    assert resume_diff.main([str(bad), str(good)]) == 2
    assert f"{bad}: 'log_history' has no per-step entry" in capsys.readouterr().err


def test_deeply_nested_json_is_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert resume_diff.main([str(bad), str(bad)]) == 2
    assert f"{bad}: invalid JSON" in capsys.readouterr().err


def test_unreadable_file_and_directory(tmp_path, capsys, monkeypatch):
    """Permission errors, simulated (chmod does not stop root)."""
    good = write_state(tmp_path / "good.json", make_history())
    unreadable = write_state(tmp_path / "unreadable.json", make_history())
    closed = tmp_path / "closed_run"
    write_state(closed / "checkpoint-2" / "trainer_state.json", make_history())

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(resume_diff, "open", denied, raising=False)
    assert resume_diff.main([str(unreadable), str(good)]) == 2
    assert f"{unreadable}: cannot be read ([Errno 13] Permission denied" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setattr(resume_diff.os, "listdir", denied)
    assert resume_diff.main([str(good), str(closed)]) == 2
    assert f"{closed}: directory cannot be listed ([Errno 13] Permission denied" in capsys.readouterr().err


def test_checkpoint_dirs_with_non_numeric_suffix_are_not_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    write_state(run / "checkpoint-latest" / "trainer_state.json", make_history())
    write_state(run / "checkpoint-1x" / "trainer_state.json", make_history())
    good = write_state(tmp_path / "good.json", make_history())
    assert resume_diff.main([str(good), str(run)]) == 2
    assert "no trainer_state.json and no checkpoint-N/trainer_state.json" in capsys.readouterr().err
    write_state(run / "checkpoint-4" / "trainer_state.json", make_history(steps=4))
    assert resume_diff.load_log_history(str(run))[1] == str(run / "checkpoint-4" / "trainer_state.json")


def test_checkpoint_dir_without_trainer_state(tmp_path, capsys):
    checkpoint = tmp_path / "run" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    (checkpoint / "scaler.pt").write_bytes(b"")
    good = write_state(tmp_path / "good.json", make_history())
    assert resume_diff.main([str(checkpoint), str(good)]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint}: directory has no trainer_state.json" in err


@pytest.mark.parametrize("value", ["-0.1", "nan", "inf", "abc"])
def test_rtol_must_be_finite_and_non_negative(tmp_path, capsys, value):
    a = write_state(tmp_path / "a.json", make_history())
    with pytest.raises(SystemExit) as exit_info:
        resume_diff.main([str(a), str(a), f"--rtol={value}"])
    assert exit_info.value.code == 2
    assert f"argument --rtol: must be a finite number >= 0, got '{value}'" in capsys.readouterr().err


def test_rtol_zero_and_positive_are_accepted(tmp_path):
    a = write_state(tmp_path / "a.json", make_history())
    assert resume_diff.main([str(a), str(a), "--rtol", "0"]) == 0
    assert resume_diff.main([str(a), str(a), "--rtol", "1e-6"]) == 0


def test_run_incomplete_at_the_first_step():
    later = [entry for entry in make_history() if entry["step"] >= 3]
    divergence = compare(make_history(), later)["divergence"]
    assert divergence["step"] == 1 and divergence["cause"] == "run_incomplete"
    assert "B has no log entry for step 1 (nor any before it)" in divergence["explanation"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (None, "no run to read: a path (directory or trainer_state.json) is needed, got None"),
        (3, "no run to read: a path (directory or trainer_state.json) is needed, got 3"),
        ("", "no run to read: the path is empty"),
    ],
)
def test_no_path_is_a_resume_diff_error(path, expected):
    """What repro passes for a run lost with its process: its own error (exit status 2 in main), not a TypeError."""
    with pytest.raises(resume_diff.ResumeDiffError, match=re.escape(expected)):
        resume_diff.load_log_history(path)


def test_missing_path_is_a_resume_diff_error(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    with pytest.raises(resume_diff.ResumeDiffError, match=re.escape(f"{missing}: no such file or directory")):
        resume_diff.load_log_history(missing)  # a Path works as well as a str
    good = write_state(tmp_path / "good.json", make_history())
    assert resume_diff.main(["", str(good)]) == 2
    assert "resume_diff: error: no run to read: the path is empty" in capsys.readouterr().err
