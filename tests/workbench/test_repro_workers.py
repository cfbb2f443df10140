"""Tests for utils/repro/workers.py: a worker that dies, and the driver that fails, leave no worker behind."""

import subprocess
import sys
import time
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import cli, scenarios, workers  # noqa: E402
from repro_testing import write_script  # noqa: E402


def test_a_worker_that_dies_becomes_crashed_runs_and_the_other_finishes(tmp_path, monkeypatch, capsys):
    fork_results = {"variant": "fork", "transformers_file": "/fork/transformers/__init__.py", "device": "cpu"}
    fork_results |= {"transformers_version": "5.24.0", "torch_version": "2", "runs": {}}
    (tmp_path / "fork").mkdir()
    commands = {
        "stock": write_script(
            tmp_path / "stock.py", "import sys\nprint('RuntimeError: boom', file=sys.stderr)\nraise SystemExit(3)\n"
        ),
        "fork": write_script(
            tmp_path / "fork.py",
            "import json, time\ntime.sleep(1)\n"
            f"json.dump({fork_results!r}, open({str(tmp_path / 'fork' / 'worker.json')!r}, 'w'))\n",
        ),
    }
    monkeypatch.setattr(workers, "worker_command", lambda variant, options: commands[variant])
    options = cli.parse_args(["--out", str(tmp_path), "--stock-src", str(tmp_path / "stock")])
    results = workers.run_workers(options)
    assert results["fork"] == fork_results
    stock = results["stock"]
    assert stock["transformers_file"] is None
    expected_runs = {name for scenario in scenarios.SCENARIOS.values() for name in scenario[1:3]}
    assert set(stock["runs"]) == expected_runs
    why = "the stock worker failed (exit status 3); last error: RuntimeError: boom"
    assert all(
        run == {"dir": None, "status": "crashed", "error": why, "process_failed": True}
        for run in stock["runs"].values()
    )
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and f"repro: {why}" in err


def test_an_exception_in_the_driver_stops_the_workers(tmp_path, monkeypatch):
    """The first worker ends at once, the second would run for a minute: it is stopped (SIGINT) when the driver fails."""
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

    monkeypatch.setattr(workers, "worker_command", lambda variant, options: commands[variant])
    monkeypatch.setattr(workers, "_read_worker_results", interrupted)
    monkeypatch.setattr(workers.subprocess, "Popen", RecordingPopen)
    options = cli.parse_args(["--out", str(tmp_path), "--stock-src", str(tmp_path / "stock")])
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        workers.run_workers(options)
    assert len(started) == 2
    assert started[0].returncode == 3
    assert started[1].returncode not in (None, 0)  # stopped and reaped (SIGINT's status, or 1 in its start-up)
    assert time.monotonic() - start < 30
