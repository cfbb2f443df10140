"""Tests for utils/repro/verdicts.py: the probe's fields, the verdict lines, whether a variant behaves as fixed."""

import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import verdicts  # noqa: E402
from repro_testing import ROWS, result  # noqa: E402


def test_probe_fields_take_the_logged_names_only_when_missing():
    stock = [{"loss": 1.0, "step": 1, "repro_grad_scale": 8192.0, "repro_num_skipped_updates": 2}]
    normalized, observed = verdicts.with_probe_fields(stock)
    assert observed
    assert normalized == [{"loss": 1.0, "step": 1, "grad_scale": 8192.0, "num_skipped_updates": 2}]
    fork = [{"loss": 1.0, "step": 1, "grad_scale": 4096.0, "num_skipped_updates": 1}]
    assert verdicts.with_probe_fields(fork) == (fork, False)


def test_verdicts():
    assert verdicts.verdict("exact_resume", result(ROWS, ROWS)) == "identical (2 steps, bit-exact)"
    crashed = result(ROWS, {1: ROWS[1]}, status="crashed", error="AttributeError: boom")
    assert verdicts.verdict("bf16_resume", crashed) == "crashes: AttributeError: boom"
    reset = {1: ROWS[1], 2: {**ROWS[2], "grad_norm": float("inf"), "grad_scale": 32768.0, "num_skipped_updates": 1}}
    line = verdicts.verdict("no_scaler_pt", result(ROWS, reset))
    assert line == "diverges at step 2 (grad_norm 1.1 -> inf; loss_scale_reset); says nothing about the loss scale"
    warned = result(
        ROWS, reset, messages=["WARNING: No scaler.pt in /x/y/checkpoint-1: the fp16 loss scale restarts at 65536.0"]
    )
    assert (
        "says: WARNING: No scaler.pt in .../checkpoint-1: the fp16 loss scale restarts at 65536.0"
        in verdicts.verdict("no_scaler_pt", warned)
    )
    assert verdicts.fork_behaves_as_fixed("no_scaler_pt", warned)
    assert not verdicts.fork_behaves_as_fixed("no_scaler_pt", result(ROWS, reset))


def test_ddp_verdicts():
    same = {**result(ROWS, ROWS), "processes_hold_the_same_model": True}
    assert verdicts.verdict("ddp_exact_resume", same) == (
        "identical (2 steps, bit-exact); both processes hold the same model"
    )
    assert verdicts.fork_behaves_as_fixed("ddp_exact_resume", same)
    drifted = {**same, "processes_hold_the_same_model": False}
    assert not verdicts.fork_behaves_as_fixed("ddp_exact_resume", drifted)
    assert verdicts.verdict("ddp_exact_resume", drifted) == (
        "identical (2 steps, bit-exact); the two processes now train DIFFERENT models"
    )
