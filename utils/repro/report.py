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
# Every field a verdict can name as the first divergence has its panel (skipped updates: marks on the LR panel).
PANELS = (
    ("learning_rate", "learning rate"),
    ("loss", "loss"),
    ("grad_norm", "grad norm"),
    ("grad_scale", "loss scale (log2)"),
)
COLORS = {"stock": "tab:red", "fork": "tab:blue"}
WRAP = 180  # characters per caption line: the figure's width at its font sizes (nothing is cut off)


def _variant_label(report: dict, variant: str) -> str:
    found = report["variants"].get(variant, {})
    versions = f"transformers {found.get('transformers_version')}, accelerate {found.get('accelerate_version')}"
    return f"stock ({versions})" if variant == "stock" else f"with the PRs (the forks: {versions} + patches)"


def plot_figure(report: dict, options):
    """The figure of `repro.png`: per scenario, what stock does wrong and what the PRs change, then one row of panels
    (learning rate, loss, grad norm, loss scale against the step; the reference run thick, the candidate dashed, its
    skipped updates marked, the first divergence shaded in the panel of the field that diverged) per variant, stock
    and fork on axes of the same y range, the fork's panels with stock's candidate in gray beneath."""
    # A bare Figure, not pyplot: no backend to choose (`matplotlib.use`) and no figure registry, so that plotting
    # leaves the caller's matplotlib as it was (savefig renders with Agg for a .png).
    from matplotlib.figure import Figure

    scenarios = report["scenarios"]
    height = [1.3 + 2.6 * len(entry["variants"]) for entry in scenarios.values()]
    fig = Figure(figsize=(16, sum(height) + 0.8), layout="constrained")
    fig.suptitle(
        textwrap.fill(
            "transformers#34053, fp16 resume: per scenario, stock (red) above the PRs (blue), same y axes; thick: the "
            "reference run, dashed: the candidate, gray: stock's candidate under the PRs'; dotted: the resume step; "
            "shaded: the first divergence; \u25bc: an update skipped; \u00d7: inf/nan (overflow)",
            WRAP,
        ),
        fontsize=11,
    )
    blocks = fig.subfigures(len(scenarios), 1, height_ratios=height, squeeze=False)[:, 0]
    for number, (block, (scenario, entry)) in enumerate(zip(blocks, scenarios.items()), start=1):
        wrong, fixed = EXPLANATIONS[scenario]
        labels = SCENARIOS[scenario][3]
        block.suptitle(
            f"{number}. {scenario}: {entry['title']} (reference: {labels[0]}, candidate: {labels[1]})\n"
            + textwrap.fill(f"stock: {wrong}", WRAP)
            + "\n"
            + textwrap.fill(f"with the PRs: {fixed}", WRAP),
            fontsize=10,
            x=0.01,
            ha="left",
        )
        block.set_facecolor("0.96" if number % 2 else "white")
        rows = block.subfigures(len(entry["variants"]), 1, squeeze=False)[:, 0]
        stock = entry["variants"].get("stock")
        axes = [
            _plot_variant(row, scenario, variant, result, report, options, None if variant == "stock" else stock)
            for row, (variant, result) in zip(rows, entry["variants"].items())
        ]
        for column in zip(*axes):  # a scenario's rows on the same y range, panel by panel
            limits = [ax.get_ylim() for ax in column if ax.has_data()]
            if limits:
                for ax in column:
                    ax.set_ylim(min(low for low, _ in limits), max(high for _, high in limits))
    return fig


def _points(rows: dict, field: str) -> tuple[list, list]:
    """The finite (step, value) points of `field`, and the steps where it is inf or nan."""
    values = [(step, row.get(field)) for step, row in rows.items() if isinstance(row.get(field), (int, float))]
    return [(s, v) for s, v in values if math.isfinite(v)], [s for s, v in values if not math.isfinite(v)]


def _annotate_skips(ax, result: dict, marks: dict) -> None:
    """Says on the LR panel what the schedule did on the candidate's last skipped updates: held (fixed) or advanced."""
    advanced = set(result["lr_advanced_on_skipped_updates"])
    last = max(marks)
    what = "advanced on" if last in advanced else "held on"
    steps = [s for s in sorted(marks) if (s in advanced) == (last in advanced)][-3:]
    verdict = "the fused_skip bug" if last in advanced else "as it must"
    ax.annotate(
        f"LR {what} skipped update{'s' * (len(steps) > 1)} {format_steps(steps)}\n({verdict})",
        xy=(last, marks[last]),
        xytext=(0.03, 0.06),
        textcoords="axes fraction",
        fontsize=8.5,
        arrowprops={"arrowstyle": "->", "color": "black", "linewidth": 0.8},
    )


def _plot_variant(row, scenario: str, variant: str, result: dict, report: dict, options, stock: dict | None) -> list:
    """One variant's row of panels (with `stock`'s candidate in gray beneath, for the fork). Returns its axes."""
    color = COLORS.get(variant, "black")
    caption = f"{_variant_label(report, variant)}: {result['verdict']}"
    note = lr_note(result)
    if note:
        caption += f". Note: {note}"
    row.suptitle(textwrap.fill(caption, WRAP), fontsize=9.5, color=color, x=0.01, ha="left")
    skipped = set(result.get("skipped_steps") or [])
    divergence = result["comparison"]["divergence"]
    axes = row.subplots(1, len(PANELS))
    for ax, (field, name) in zip(axes, PANELS):
        runs = [
            (result["reference_rows"], color, {"linestyle": "-", "linewidth": 4, "alpha": 0.3}),
            (
                result["candidate_rows"],
                color,
                {"linestyle": "--", "marker": "o", "markersize": 3, "linewidth": 1.2, "markerfacecolor": "none"},
            ),
        ]
        if stock is not None:
            runs.insert(0, (stock["candidate_rows"], "0.55", {"linewidth": 1, "zorder": 1}))
        for rows, line_color, style in runs:
            points, overflows = _points(rows, field)
            if points:
                ax.plot(*zip(*points), color=line_color, **style)
            if overflows and line_color == color:
                ax.plot(
                    overflows,
                    [0.97] * len(overflows),
                    transform=ax.get_xaxis_transform(),
                    linestyle="none",
                    marker="x",
                    color=color,
                    markersize=7,
                )
        if field == "learning_rate":
            marks = [(s, r["learning_rate"]) for s, r in result["candidate_rows"].items() if s in skipped]
            if marks:
                ax.plot(*zip(*marks), linestyle="none", marker="v", color="black", markersize=6)
                _annotate_skips(ax, result, dict(marks))
        if scenario in RESUME_SCENARIOS + DDP_SCENARIOS:
            ax.axvline(options.resume_step, color="gray", linestyle=":", linewidth=1)
        if field == "grad_scale":
            ax.set_yscale("log", base=2)
        title = name
        if field == "grad_scale" and variant == "stock":
            title += " (observed by repro)"
        if divergence is not None and divergence["fields"][0]["field"] == field:
            ax.axvspan(divergence["step"] - 0.5, divergence["step"] + 0.5, color=color, alpha=0.15, linewidth=0)
            title += f"\nfirst divergence: step {divergence['step']}"
        if not any(_points(rows, field)[0] for rows in (result["reference_rows"], result["candidate_rows"])):
            title += ": none logged" + (" (crashed)" if result["status"] == "crashed" else "")
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8.5)
    return list(axes)


def plot_report(report: dict, options, path: str) -> None:
    """Writes `plot_figure` to `path` (a PNG)."""
    plot_figure(report, options).savefig(path, dpi=90)


# The workers' own records of their runs (`worker.json`, and the two-process runs' `ddp.json`): they name the run
# folders, as the report does. The runs' checkpoints are the Trainer's, and are not rewritten.
RECORDS = {"worker.json", "ddp.json"}


def write_report(report: dict, options, final: str) -> tuple[str, str]:
    """
    Writes `report.json` and `repro.png` under `--out` (the new run's folder), naming its paths, and those of the
    workers' records, as they will be once it is moved to `final`. Returns their paths there.
    """

    def moved(text: str) -> str:
        return text.replace(options.out + os.sep, final + os.sep)

    for folder, _, names in os.walk(options.out):
        for path in (os.path.join(folder, name) for name in RECORDS.intersection(names)):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(moved(text))
    with open(os.path.join(options.out, "report.json"), "w", encoding="utf-8") as f:
        f.write(moved(json.dumps(resume_diff.json_safe(report), indent=2)))
    plot_report(report, options, os.path.join(options.out, "repro.png"))
    return os.path.join(final, "report.json"), os.path.join(final, "repro.png")
