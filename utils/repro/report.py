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


def plot_report(report: dict, options, path: str) -> None:
    """Learning rate, loss and loss scale against the step: one row per scenario, reference vs candidate."""
    # A bare Figure, not pyplot: no backend to choose (`matplotlib.use`) and no figure registry, so that plotting
    # leaves the caller's matplotlib as it was (savefig renders with Agg for a .png).
    from matplotlib.figure import Figure

    scenarios = report["scenarios"]
    # Constrained layout places the figure title above the subplots' titles (tight_layout let them overlap).
    fig = Figure(figsize=(15, 3.6 * len(scenarios)), layout="constrained")
    axes = fig.subplots(len(scenarios), 3, squeeze=False)
    colors = {"stock": "tab:red", "fork": "tab:blue"}
    markers = {"stock": "x", "fork": "o"}  # distinct, so that overlapping curves stay visible
    for axes_row, (scenario, entry) in zip(axes, scenarios.items()):
        labels = SCENARIOS[scenario][3]
        crashed = [variant for variant, result in entry["variants"].items() if result["status"] == "crashed"]
        for column, (ax, field) in enumerate(zip(axes_row, ("learning_rate", "loss", "grad_scale"))):
            for variant, result in entry["variants"].items():
                for rows, label, style in (
                    (result["reference_rows"], labels[0], {"linestyle": "-", "linewidth": 3, "alpha": 0.35}),
                    (
                        result["candidate_rows"],
                        labels[1],
                        {
                            "linestyle": "--",
                            "marker": markers[variant],
                            "markersize": 4,
                            "linewidth": 1,
                            "markerfacecolor": "none",
                        },
                    ),
                ):
                    points = [(s, r[field]) for s, r in rows.items() if isinstance(r.get(field), (int, float))]
                    points = [(s, v) for s, v in points if math.isfinite(v)]
                    if points:
                        ax.plot(*zip(*points), color=colors[variant], label=f"{variant} {label}", **style)
            if scenario in RESUME_SCENARIOS + DDP_SCENARIOS:
                ax.axvline(options.resume_step, color="gray", linestyle=":", linewidth=1)
            if field == "grad_scale":
                ax.set_yscale("log", base=2)
            title = f"{scenario}: {field}"
            if crashed:
                lost = [v for v in crashed if not entry["variants"][v]["reference_rows"]]
                what = "no curves" if len(lost) == len(crashed) else "no resumed curve"
                title += f" ({', '.join(crashed)}: crashed, {what})"
            if field == "learning_rate":
                for variant, result in entry["variants"].items():
                    note = lr_note(result)
                    if note:
                        title += "\n" + textwrap.fill(f"{variant}: {note}", 76)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step")
            if column == 0:
                ax.legend(fontsize=7)
    fig.suptitle(
        "transformers#34053: reference (thick) vs candidate (dashed), stock (red, x) vs fork (blue, o); "
        "dotted line: resume step",
        fontsize=11,
    )
    fig.savefig(path, dpi=90)


def write_report(report: dict, options) -> tuple[str, str]:
    """Writes `report.json` and `repro.png` under `--out`. Returns their paths."""
    report_path, plot_path = os.path.join(options.out, "report.json"), os.path.join(options.out, "repro.png")
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(resume_diff.json_safe(report), f, indent=2)
    plot_report(report, options, plot_path)
    return report_path, plot_path
