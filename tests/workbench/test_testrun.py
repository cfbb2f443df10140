"""Tests for utils/testrun.py (`make test`): its [k/n] stage lines, its summary, and its exit status."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from test_fork import ctrl_c, fake_test_run, running


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
_spec = importlib.util.spec_from_file_location("workbench_testrun", REPO_ROOT / "utils" / "testrun.py")
testrun = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(testrun)


def fake_stages(pytest_args):
    def stage(output, status):
        return [sys.executable, "-c", f"import sys; print({output!r}); sys.exit({status})"]

    return [
        ("the stack", stage("== PR a at its level\n== PR a without its fix\nFAIL: a does not apply", 1), {}),
        ("every test", stage("=== 2 failed, 120 passed, 4 skipped in 12.34s ===", 1), {}),
        ("upstream's pins", stage("7 passed in 3.01s", 0), {}),
    ]


def test_every_stage_runs_and_the_summary_names_each_outcome(monkeypatch, capfd):
    monkeypatch.setattr(testrun, "stages", fake_stages)
    assert testrun.main([]) == 1
    out = capfd.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("[")][:3] == [
        "[1/3] the stack",
        "[2/3] every test",
        "[3/3] upstream's pins",
    ]
    summary = out[out.index("== make test: summary (3 of 3 stages, ") :].splitlines()
    assert summary[1].startswith("[1/3] FAILED (exit status 1)") and summary[1].endswith("the stack")
    assert summary[2].strip() == "2 PR test runs, 1 problem"
    assert summary[3].startswith("[2/3] FAILED (exit status 1)")
    assert summary[4].strip() == "2 failed, 120 passed, 4 skipped"
    assert summary[5].startswith("[3/3] ok ") and summary[6].strip() == "7 passed"
    assert summary[7] == "make test: FAILED: stages 1, 2 (output above)"
    assert len(summary) == 8  # one screen


def test_all_stages_ok_exit_0(monkeypatch, capfd):
    monkeypatch.setattr(testrun, "stages", lambda args: fake_stages(args)[2:])
    assert testrun.main([]) == 0
    assert capfd.readouterr().out.endswith("make test: every stage ok\n")


def test_the_stages_are_the_makefiles_commands():
    commands = [" ".join(command) for _, command, _ in testrun.stages("-n 2")]
    assert len(commands) == 4
    assert commands[0].endswith("utils/fork.py check --tests --pytest-args=-n 2")
    assert commands[1].endswith("-m workbench.testenv -p pytest_global_state -n 2 tests")
    assert "upstream_pins.py --extra deepspeed" in commands[3]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the processes' states in /proc (Linux)")
@pytest.mark.parametrize("again", [False, True], ids=["once", "twice"])
def test_ctrl_c_stops_the_stage_quietly_and_lets_it_clean_up(tmp_path, again):
    """Ctrl-C (SIGINT to the terminal's process group) in a stage: the stage runs in a session of its own and gets
    Ctrl-C from make test, so it cleans up (`make check` removes its levels) with its output unshown (a pytest-xdist
    traceback, the stage's own line); make test prints its one line. A second Ctrl-C does not cut that short (make test
    ended while the stage, out of reach, was still cleaning up)."""
    pids, cleaned = tmp_path / "pids", tmp_path / "cleaned"
    stage = fake_test_run(pids, on_ctrl_c=f"time.sleep(1); open({str(cleaned)!r}, 'w').close()")
    driver = (
        f"import importlib.util, sys; sys.path.insert(0, {str(REPO_ROOT / 'utils')!r})\n"
        f"spec = importlib.util.spec_from_file_location('testrun', {str(REPO_ROOT / 'utils' / 'testrun.py')!r})\n"
        "testrun = importlib.util.module_from_spec(spec); spec.loader.exec_module(testrun)\n"
        f"testrun.stages = lambda args: [('the stack', [sys.executable, '-c', {stage!r}], {{}})]\n"
        "sys.exit(testrun.main([]))\n"
    )
    status, out = ctrl_c(driver, pids, again)
    assert status == 130 and cleaned.exists()
    assert out.splitlines()[-2:] == [
        "",
        "make test: interrupted in its first stage (at [1/1]); nothing is left to clean up: run `make test` again.",
    ]
    assert "Traceback" not in out
    assert not [pid for pid in map(int, pids.read_text(encoding="utf-8").split()) if running(pid)]
