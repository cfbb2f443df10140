"""Tests for utils/repro/launch.py: torchrun's output read for why a launch failed, and a failed launch's records."""

import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import cli, launch, verdicts  # noqa: E402
from repro_testing import write_script  # noqa: E402


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
utils/repro FAILED
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
    assert launch.torchrun_root_cause(lines) == "rank 1 exited with -6 (SIGABRT)"
    assert launch.last_error_line(lines) == "terminate called without an active exception"
    assert launch.torchrun_root_cause(
        ["Root Cause (first observed failure):", "[0]:", "  rank : 0", "  exitcode : 1"]
    ) == ("rank 0 exited with 1")
    python_error = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "[rank1]: ValueError: Cannot resume",
    ]
    assert launch.last_error_line(python_error) == "[rank1]: ValueError: Cannot resume"
    assert launch.torchrun_root_cause(["no block"]) is None
    assert launch.last_error_line(["[fork] ddp: running 2 processes ..."]) is None


def test_a_failed_ddp_launch_is_a_crashed_run_with_its_root_cause(tmp_path, monkeypatch, capsys):
    """A fake torchrun prints what torchrun did when a process aborted at exit, after the results were written."""
    base = tmp_path / "fork"
    fake = write_script(
        tmp_path / "fake_torchrun.py",
        "import json, os, sys\n"
        f"os.makedirs({str(base / 'ddp')!r})\n"
        f"json.dump({{}}, open({str(base / 'ddp' / 'ddp.json')!r}, 'w'))\n"
        f"sys.stdout.write({TORCHRUN_ABORT_OUTPUT!r})\n"
        "raise SystemExit(1)\n",
    )
    monkeypatch.setattr(launch, "_ddp_command", lambda variant, options, port: fake)
    (base / "ddp").mkdir(parents=True)
    (base / "ddp" / "stale").write_text("", encoding="utf-8")  # an earlier launch's: removed before this one
    options = cli.parse_args(["--out", str(tmp_path), "--scenarios", "ddp_exact_resume"])
    runs = launch.launch_ddp_runs("fork", options, str(base))
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
    result = verdicts.compare_variant("ddp_exact_resume", worker)  # no TypeError on the run without a directory
    assert result["verdict"] == f"crashed: {record['error']}"
    assert not result["behaves_as_fixed"]
    assert result["reference_rows"] == {} and result["candidate_rows"] == {}


def test_ctrl_c_stops_torchrun_and_its_output_is_not_shown(tmp_path, monkeypatch, capsys):
    """
    torchrun runs in a session of its own, which Ctrl-C does not reach: the worker, interrupted, stops it (SIGTERM, on
    which torchrun stops its processes), and what torchrun prints then (its traceback) is not shown.
    """
    stopped = tmp_path / "stopped"
    fake = write_script(
        tmp_path / "fake_torchrun.py",
        "import os, signal, sys, time\n"
        "def stop(*args):\n"
        "    print('Traceback (most recent call last):\\nSignalException: Process got signal: 15', flush=True)\n"
        f"    open({str(stopped)!r}, 'w').close()\n"
        "    raise SystemExit(1)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('started', flush=True)\n"
        "os.kill(os.getppid(), signal.SIGINT)\n"  # the worker's Ctrl-C, while it waits for torchrun
        "time.sleep(60)\n",
    )
    monkeypatch.setattr(launch, "_ddp_command", lambda variant, options, port: fake)
    options = cli.parse_args(["--out", str(tmp_path), "--scenarios", "ddp_exact_resume"])
    with pytest.raises(KeyboardInterrupt):
        launch.launch_ddp_runs("fork", options, str(tmp_path / "fork"))
    assert stopped.exists()
    assert "Traceback" not in capsys.readouterr().out
