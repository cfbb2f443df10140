"""Tests for utils/repro/report.py: the per-step table."""

import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import report  # noqa: E402
from repro_testing import ROWS, result  # noqa: E402


def test_table_marks_the_first_divergence():
    reset = {1: ROWS[1], 2: {**ROWS[2], "loss_scale": 32768.0}}
    table = report.format_table("no_scaler_pt", result(ROWS, reset))
    lines = table.splitlines()
    assert "uninterrupted" in lines[0] and "resumed" in lines[0]
    assert lines[2].rstrip().endswith("|")  # step 1: nothing differs
    assert lines[3].endswith("| loss_scale  <- first divergence")
    assert "32768" in lines[3]
