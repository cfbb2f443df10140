"""Tests for utils/repro/report.py: the per-step table, the note on an LR that advanced on skipped updates."""

import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import report  # noqa: E402
from repro_testing import ROWS, result  # noqa: E402


def test_table_marks_the_first_divergence():
    reset = {1: ROWS[1], 2: {**ROWS[2], "grad_scale": 32768.0}}
    table = report.format_table("no_scaler_pt", result(ROWS, reset))
    lines = table.splitlines()
    assert "uninterrupted" in lines[0] and "resumed" in lines[0]
    assert lines[2].rstrip().endswith("|")  # step 1: nothing differs
    assert lines[3].endswith("| grad_scale  <- first divergence")
    assert "32768" in lines[3]


def test_lr_note_names_the_skipped_updates_the_lr_advanced_on():
    skipped_first = {1: {**ROWS[1], "num_skipped_updates": 1}, 2: {**ROWS[2], "num_skipped_updates": 1}}
    note = report.lr_note(result(skipped_first, skipped_first))
    assert note.startswith(
        "the LR advanced on the updates its default fused optimizer skipped (steps 1), as in fused_skip"
    )
    assert note.endswith("not a resume difference")
    held = {1: skipped_first[1], 2: {**skipped_first[2], "learning_rate": ROWS[1]["learning_rate"]}}
    assert report.lr_note(result(held, held)) is None
    assert report.lr_note(result(ROWS, ROWS)) is None  # nothing skipped
