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


def test_the_plot_explains_itself_without_the_console():
    """Per scenario: what stock does wrong and what the PRs change; stock and fork on separate axes; every panel with
    a legend; the candidate's skipped updates marked."""
    import argparse

    skipped = {**ROWS, 3: {**ROWS[2], "num_skipped_updates": 1, "grad_scale": 4096.0}}
    variants = {}
    for variant in ("stock", "fork"):
        variants[variant] = {**result(skipped, skipped), "loss_scale_observed_by_repro": variant == "stock"}
        variants[variant]["verdict"] = f"{variant}'s verdict"
    crashed = {**result(ROWS, {}, status="crashed", error="AttributeError: x"), "loss_scale_observed_by_repro": True}
    crashed["verdict"] = "crashes: AttributeError: x"
    found = {"transformers_version": "5.25.0", "accelerate_version": "1.16.0"}
    fake = {
        "variants": {"stock": found, "fork": found},
        "scenarios": {
            "no_scaler_pt": {"title": "resume without scaler.pt", "variants": variants},
            "bf16_resume": {"title": "resume with bf16", "variants": {"stock": crashed, "fork": variants["fork"]}},
        },
    }
    fig = report.plot_figure(fake, argparse.Namespace(resume_step=1))
    blocks = fig.subfigs
    assert len(blocks) == 2
    heading = blocks[0]._suptitle.get_text()
    assert heading.startswith("1. no_scaler_pt: resume without scaler.pt\nstock: the loss scale silently restarts")
    assert "\nwith the PRs: the same unavoidable restart" in heading and "not a regression" in " ".join(
        heading.split()
    )
    for block in blocks:
        rows = block.subfigs
        assert [row._suptitle.get_text().split(" (")[0] for row in rows] == ["stock", "with the PRs"]
        for row, color in zip(rows, ("tab:red", "tab:blue")):
            axes = row.axes
            assert [ax.get_title().split("\n")[0].split(":")[0].split(",")[0] for ax in axes] == [
                "learning rate",
                "loss",
                "loss scale (log2)",
            ]
            for ax in axes:
                lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
                assert {line.get_color() for line in lines} <= {color, "black"}  # one variant per axes
                if lines:
                    assert ax.get_legend() is not None, ax.get_title()
    lr, _, scale = blocks[0].subfigs[1].axes
    assert "update skipped" in [line.get_label() for line in lr.get_lines()]
    assert blocks[0].subfigs[0].axes[2].get_title() == "loss scale (log2), observed by repro (stock does not log it)"
    assert "crashes: AttributeError: x" in blocks[1].subfigs[0]._suptitle.get_text()
