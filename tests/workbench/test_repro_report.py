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
    """Per scenario: what stock does wrong and what the PRs change; stock and fork in separate rows on the same y
    ranges, the fork's with stock's candidate in gray; the field the verdict calls divergent plotted and its first
    divergence named; the candidate's skipped updates marked and what the LR did on them said; no caption cut."""
    import argparse
    import math

    skipped = {**ROWS, 3: {**ROWS[2], "num_skipped_updates": 1, "grad_scale": 4096.0}}
    # the fork's candidate: a grad_norm that overflows at step 2 (the verdict's first divergence), a larger loss after
    diverged = {**skipped, 2: {**skipped[2], "grad_norm": math.nan}, 3: {**skipped[3], "loss": 9.0}}
    variants = {"stock": result(skipped, skipped), "fork": result(skipped, diverged)}
    for variant, found in variants.items():
        found.update(loss_scale_observed_by_repro=variant == "stock", verdict=f"{variant}'s verdict " + "x" * 300)
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
    assert max(len(line) for line in fig._suptitle.get_text().splitlines()) <= report.WRAP
    heading = blocks[0]._suptitle.get_text()
    assert heading.startswith("1. no_scaler_pt: resume without scaler.pt (reference: uninterrupted, candidate: ")
    assert "\nstock: the loss scale silently restarts" in heading
    assert "\nwith the PRs: the same unavoidable restart" in heading and "not a regression" in " ".join(
        heading.split()
    )
    for block in blocks:
        rows = block.subfigs
        assert [row._suptitle.get_text().split(" (")[0] for row in rows] == ["stock", "with the PRs"]
        for row in rows:  # the whole caption, wrapped to the figure's width
            caption = row._suptitle.get_text()
            assert "x" * 300 in caption.replace("\n", "") or "crashes" in caption
            assert max(len(line) for line in caption.splitlines()) <= report.WRAP
        for row in rows:
            assert [ax.get_title().split("\n")[0].split(" (o")[0].split(":")[0] for ax in row.axes] == [
                "learning rate",
                "loss",
                "grad norm",
                "loss scale (log2)",
            ]
        for stock_ax, fork_ax in zip(rows[0].axes, rows[1].axes):  # the same y range, panel by panel
            if stock_ax.has_data():
                assert stock_ax.get_ylim() == fork_ax.get_ylim(), stock_ax.get_title()
    stock_row, fork_row = blocks[0].subfigs
    lr, loss, grad_norm, scale = fork_row.axes
    assert grad_norm.get_title() == "grad norm\nfirst divergence: step 2"  # the field the verdict names
    assert any(list(line.get_xdata()) == [2] and line.get_marker() == "x" for line in grad_norm.get_lines())
    assert "0.55" in [line.get_color() for line in loss.get_lines()]  # stock's candidate beneath the fork's
    assert "0.55" not in [line.get_color() for line in stock_row.axes[1].get_lines()]
    assert stock_row.axes[1].get_ylim()[1] >= 9.0  # the stock row's range holds the fork's larger loss
    assert [text.get_text() for text in lr.texts] == ["LR held on skipped update 3\n(as it must)"]
    assert stock_row.axes[3].get_title() == "loss scale (log2) (observed by repro)"
    assert "crashes: AttributeError: x" in blocks[1].subfigs[0]._suptitle.get_text()
