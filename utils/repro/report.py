"""What the driver shows and writes: the per-step tables and the verdicts, `report.json`, and `repro.png`."""

import json
import math
import os
import textwrap

import resume_diff

from .launch import shorten
from .scenarios import (
    BATCH_SIZE,
    DDP_SCENARIOS,
    INITIALIZER_RANGE,
    LEARNING_RATE,
    LR_SCHEDULER,
    RESUME_SCENARIOS,
    SCENARIOS,
)
from .verdicts import compare_variant, format_steps
from .workers import VERSION_KEYS


TABLE_FIELDS = ("learning_rate", "loss", "grad_norm", "grad_scale", "num_skipped_updates")


def _cell(row: dict | None, field: str) -> str:
    if row is None:
        return "-"
    value = row.get(field)
    if value is None:
        return "-"
    if field == "learning_rate":
        return f"{value:.4e}"
    if field in ("loss", "grad_norm") and isinstance(value, float):
        return f"{value:.4f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_table(scenario: str, result: dict, first_step: int = 1) -> str:
    """Per-step table of the reference and candidate runs, with the fields that differ at each step."""
    labels = SCENARIOS[scenario][3]
    rows_a, rows_b = result["reference_rows"], result["candidate_rows"]
    headers = ("lr", "loss", "grad_norm", "scale", "skip")
    widths = (10, 8, 9, 7, 4)
    half = " ".join(h.rjust(w) for h, w in zip(headers, widths))
    width = len(half)
    lines = [
        f"  step | {labels[0][:width].ljust(width)} | {labels[1][:width].ljust(width)} | differs",
        f"       | {half} | {half} |",
    ]
    divergence = result["comparison"]["divergence"]
    for step in sorted(set(rows_a) | set(rows_b)):
        if step < first_step:
            continue
        row_a, row_b = rows_a.get(step), rows_b.get(step)
        cells_a = " ".join(_cell(row_a, f).rjust(w) for f, w in zip(TABLE_FIELDS, widths))
        cells_b = " ".join(_cell(row_b, f).rjust(w) for f, w in zip(TABLE_FIELDS, widths))
        if row_a is None or row_b is None:
            differs = "(missing)"
        else:
            differs = ", ".join(d["field"] for d in resume_diff.differing_fields(row_a, row_b))
        if divergence is not None and divergence["step"] == step:
            differs += "  <- first divergence"
        lines.append(f"  {step:4d} | {cells_a} | {cells_b} | {differs}")
    return "\n".join(lines)


def build_report(options, workers: dict) -> dict:
    scenarios = {}
    for scenario in options.scenarios:
        title = SCENARIOS[scenario][0].format(r=options.resume_step, o=format_steps(options.overflow_steps))
        scenarios[scenario] = {"title": title, "variants": {}}
        for variant, worker in workers.items():
            scenarios[scenario]["variants"][variant] = compare_variant(scenario, worker)
    fork_results = [s["variants"]["fork"] for s in scenarios.values() if "fork" in s["variants"]]
    return {
        "settings": {
            "steps": options.steps,
            "resume_step": options.resume_step,
            "overflow_steps": options.overflow_steps,
            "device": next((w["device"] for w in workers.values() if w.get("device")), None),
            "batch_size": BATCH_SIZE,
            "learning_rate": LEARNING_RATE,
            "lr_scheduler_type": LR_SCHEDULER,
            "initializer_range": INITIALIZER_RANGE,
            "stock_src": options.stock_src,
        },
        "variants": {variant: {key: worker.get(key) for key in VERSION_KEYS} for variant, worker in workers.items()},
        "scenarios": scenarios,
        "fork_as_expected": all(result["behaves_as_fixed"] for result in fork_results) if fork_results else None,
    }


def lr_note(result: dict) -> str | None:
    """
    Where a variant's reference run advanced its learning rate on skipped updates (stock's default fused optimizer, in
    every scenario but fused_skip, whose reference is unfused), says why: its LR curves differ from the other
    variant's from the first skip on, in the reference and the candidate alike, for the reason fused_skip shows.
    """
    advanced = resume_diff.lr_advanced_on_skipped_updates(result["reference_rows"])
    if not advanced:
        return None
    return (
        f"the LR advanced on the updates its default fused optimizer skipped (steps {format_steps(advanced)}), as in "
        "fused_skip (the accelerate PR fixes it): not a resume difference"
    )


def print_report(report: dict, options) -> None:
    print("\n=== versions")
    for variant, found in report["variants"].items():
        print(
            f"{variant:5s}: transformers {found['transformers_version']}, accelerate {found['accelerate_version']}, "
            f"torch {found['torch_version']} ({os.path.dirname(os.path.dirname(found['transformers_file'] or '.'))})"
        )
    for number, (scenario, entry) in enumerate(report["scenarios"].items(), start=1):
        print(f"\n=== {number}. {scenario}: {entry['title']}")
        first_step = max(1, options.resume_step - 1) if scenario in RESUME_SCENARIOS + DDP_SCENARIOS else 1
        for variant, result in entry["variants"].items():
            note = " (fields this Trainer does not log, e.g. num_skipped_updates, are observed by repro)"
            print(f"\n{variant}{note if result['loss_scale_observed_by_repro'] else ''}:")
            if first_step > 1:
                print(
                    f"  (steps 1-{options.resume_step} are restored from checkpoint-{options.resume_step}'s log "
                    f"history, identical in both runs; the table starts at step {first_step})"
                )
            print(format_table(scenario, result, first_step))
            divergence = result["comparison"]["divergence"]
            if divergence is not None and divergence["explanation"]:
                print(f"  likely cause ({divergence['cause']}): {divergence['explanation']}")
            note = lr_note(result)
            if note:
                print(f"  note: {note}")
            for message in result["messages"]:
                print(f"  {shorten(message, 200)}")
            if result["status"] == "crashed":
                print(f"  CRASH: {result['error']}")
        for variant, result in entry["variants"].items():
            print(f"  verdict {variant}: {result['verdict']}")
    print("\n=== verdicts")
    for scenario, entry in report["scenarios"].items():
        for variant, result in entry["variants"].items():
            print(f"{scenario:13s} {variant:5s}: {result['verdict']}")


# What a reader of repro.png alone must see per scenario: what stock does wrong, and what the PRs change. The verdict
# of each run (the console's) is shown under it, per variant.
EXPLANATIONS = {
    "exact_resume": (
        "resumes exactly (scaler.pt is saved and loaded since transformers 4.49)",
        "the same; the PRs' parity test proves it bit for bit in CI",
    ),
    "no_scaler_pt": (
        "the loss scale silently restarts at 65536, so the next updates overflow and are skipped; its LR still matches "
        "only because its fused optimizer's skipped updates advance the schedule anyway (the fused_skip bug)",
        "the same unavoidable restart, now said at info level; the LR holds on each skipped update (the accelerate "
        "fix), so the resumed LR trails the uninterrupted one by the skipped updates: correct, not a regression",
    ),
    "bf16_resume": (
        "crashes loading scaler.pt into a run without a scaler: no resumed curve",
        "resumes in bf16 (no loss scale to plot) and says at info level that scaler.pt is not loaded",
    ),
    "fused_skip": (
        "the fused optimizer skips the overflowed updates unseen: the LR schedule advances on them (the dashed "
        "curve leaves the thick one at the first skip)",
        "accelerate sees the skip: the LR holds, as with adamw_torch (the dashed curve stays on the thick one)",
    ),
    "ddp_exact_resume": (
        "resumes exactly in two processes, which keep the same model",
        "the same",
    ),
}
PANELS = (("learning_rate", "learning rate"), ("loss", "loss"), ("grad_scale", "loss scale (log2)"))


def _variant_label(report: dict, variant: str) -> str:
    found = report["variants"].get(variant, {})
    versions = f"transformers {found.get('transformers_version')}, accelerate {found.get('accelerate_version')}"
    return f"stock ({versions})" if variant == "stock" else f"with the PRs (the forks: {versions} + patches)"


def plot_figure(report: dict, options):
    """The figure of `repro.png`: per scenario, what stock does wrong and what the PRs change, then one row of panels
    (learning rate, loss, loss scale against the step; the reference run thick, the candidate dashed, its skipped
    updates marked) per variant, stock and fork never on the same axes, each panel with its legend."""
    # A bare Figure, not pyplot: no backend to choose (`matplotlib.use`) and no figure registry, so that plotting
    # leaves the caller's matplotlib as it was (savefig renders with Agg for a .png).
    from matplotlib.figure import Figure

    scenarios = report["scenarios"]
    height = [1.2 + 2.5 * len(entry["variants"]) for entry in scenarios.values()]
    fig = Figure(figsize=(16, sum(height) + 0.6), layout="constrained")
    fig.suptitle(
        "transformers#34053, fp16 resume: each scenario's reference run (thick) and candidate run (dashed), stock "
        "(red) and with the PRs (blue) in separate rows; dotted line: the resume step",
        fontsize=12,
    )
    blocks = fig.subfigures(len(scenarios), 1, height_ratios=height, squeeze=False)[:, 0]
    for number, (block, (scenario, entry)) in enumerate(zip(blocks, scenarios.items()), start=1):
        wrong, fixed = EXPLANATIONS[scenario]
        block.suptitle(
            f"{number}. {scenario}: {entry['title']}\n"
            + textwrap.fill(f"stock: {wrong}", 190)
            + "\n"
            + textwrap.fill(f"with the PRs: {fixed}", 190),
            fontsize=10,
            x=0.01,
            ha="left",
        )
        block.set_facecolor("0.96" if number % 2 else "white")
        rows = block.subfigures(len(entry["variants"]), 1, squeeze=False)[:, 0]
        for row, (variant, result) in zip(rows, entry["variants"].items()):
            _plot_variant(row, scenario, variant, result, report, options)
    return fig


def _plot_variant(row, scenario: str, variant: str, result: dict, report: dict, options) -> None:
    color = {"stock": "tab:red", "fork": "tab:blue"}.get(variant, "black")
    labels = SCENARIOS[scenario][3]
    row.suptitle(
        textwrap.fill(f"{_variant_label(report, variant)}: {result['verdict']}", 200),
        fontsize=9,
        color=color,
        x=0.01,
        ha="left",
    )
    skipped = set(result.get("skipped_steps") or [])
    for ax, (field, name) in zip(row.subplots(1, 3), PANELS):
        for rows, label, style in (
            (result["reference_rows"], f"{labels[0]} (reference)", {"linestyle": "-", "linewidth": 4, "alpha": 0.3}),
            (
                result["candidate_rows"],
                labels[1],
                {"linestyle": "--", "marker": "o", "markersize": 3, "linewidth": 1.2, "markerfacecolor": "none"},
            ),
        ):
            points = [(s, r[field]) for s, r in rows.items() if isinstance(r.get(field), (int, float))]
            points = [(s, v) for s, v in points if math.isfinite(v)]
            if points:
                ax.plot(*zip(*points), color=color, label=label, **style)
        if field == "learning_rate":
            marks = [(s, r["learning_rate"]) for s, r in result["candidate_rows"].items() if s in skipped]
            if marks:
                ax.plot(
                    *zip(*marks), linestyle="none", marker="v", color="black", markersize=5, label="update skipped"
                )
        if scenario in RESUME_SCENARIOS + DDP_SCENARIOS:
            ax.axvline(options.resume_step, color="gray", linestyle=":", linewidth=1)
        if field == "grad_scale":
            ax.set_yscale("log", base=2)
        title = name
        if field == "grad_scale" and variant == "stock":
            title += ", observed by repro (stock does not log it)"
        if not any(line.get_label() and not line.get_label().startswith("_") for line in ax.get_lines()):
            title += ": none logged" + (" (crashed)" if result["status"] == "crashed" else "")
        if field == "learning_rate":
            note = lr_note(result)
            if note:
                title += "\n" + textwrap.fill(note, 70)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_lines():
            ax.legend(fontsize=7, loc="best")


def plot_report(report: dict, options, path: str) -> None:
    """Writes `plot_figure` to `path` (a PNG)."""
    plot_figure(report, options).savefig(path, dpi=80)


def write_report(report: dict, options, final: str) -> tuple[str, str]:
    """
    Writes `report.json` and `repro.png` under `--out` (the new run's folder), naming its paths as they will be once
    it is moved to `final`. Returns their paths there.
    """
    text = json.dumps(resume_diff.json_safe(report), indent=2).replace(options.out + os.sep, final + os.sep)
    with open(os.path.join(options.out, "report.json"), "w", encoding="utf-8") as f:
        f.write(text)
    plot_report(report, options, os.path.join(options.out, "repro.png"))
    return os.path.join(final, "report.json"), os.path.join(final, "repro.png")
