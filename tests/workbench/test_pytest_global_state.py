"""The global-state plugin (utils/pytest_global_state.py): a test that changes process-global state fails, and the
next test of the worker starts clean."""

import os
import subprocess
import sys
from pathlib import Path


UTILS = Path(__file__).resolve().parents[2] / "utils"

POISON = """
import os
import signal

import torch


def test_1_leaves_dtype_env_and_signal():
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_2_starts_clean():
    assert torch.get_default_dtype() == torch.float32
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_3_restores_what_it_changes(monkeypatch):
    monkeypatch.setenv("SOME_VARIABLE", "1")
    torch.set_num_threads(torch.get_num_threads())
"""


def test_a_test_that_changes_global_state_fails_and_the_next_starts_clean(tmp_path):
    (tmp_path / "test_poison.py").write_text(POISON, encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUBLAS_WORKSPACE_CONFIG", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(UTILS), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_global_state", "-p", "no:cacheprovider", "-q", "-rA"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 1, out
    assert "3 passed" in out and "1 error" in out, out
    assert "ERROR at teardown of test_1_leaves_dtype_env_and_signal" in out, out
    assert "torch default dtype: torch.float32 -> torch.float64" in out
    assert "torch deterministic algorithms (enabled, warn_only): (False, False) -> (True, False)" in out
    assert "environment: CUBLAS_WORKSPACE_CONFIG: '<unset>' -> ':4096:8'" in out
    assert "signal handlers: SIGTERM: <Handlers.SIG_DFL: 0> -> <Handlers.SIG_IGN: 1>" in out
