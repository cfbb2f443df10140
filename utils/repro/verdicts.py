"""
Each variant's candidate run compared with its reference run: the step rows, the verdict line, and whether the variant
behaves as fixed.
"""

import re

import resume_diff

from .runs import PROBE_FIELDS
from .scenarios import SCENARIOS


MISSING_SCALER_WARNING = "the fp16 loss scale restarts at"


def with_probe_fields(history: list[dict]) -> tuple[list[dict], bool]:
    """
    Returns `history` with repro's observed `repro_*` fields under the names of the logged fields (`grad_scale`,
    which the fork logs, and `num_skipped_updates`), and whether any was observed rather than logged.
    """
    normalized, observed = [], False
    for entry in history:
        entry = dict(entry)
        for probe_name, name in PROBE_FIELDS.items():
            if probe_name in entry:
                value = entry.pop(probe_name)
                if name not in entry:
                    entry[name] = value
                    observed = True
        normalized.append(entry)
    return normalized, observed


def _load_run(run: dict | None) -> tuple[list[dict], bool]:
    if run is None or run.get("dir") is None:  # not run, or lost with its process
        return [], False
    try:
        history, _ = resume_diff.load_log_history(run["dir"])
    except resume_diff.ResumeDiffError:
        return [], False
    return with_probe_fields(history)


def compare_variant(scenario: str, worker: dict) -> dict:
    """Compares the reference and candidate runs of `scenario` for one variant. Returns the variant's result."""
    _, reference_name, candidate_name, _ = SCENARIOS[scenario]
    reference, candidate = worker["runs"].get(reference_name), worker["runs"].get(candidate_name)
    history_a, observed_a = _load_run(reference)
    history_b, observed_b = _load_run(candidate)
    crashed = [run for run in (reference, candidate) if run is not None and run["status"] != "ok"]
    result = {
        "transformers_file": worker.get("transformers_file"),
        "status": "crashed" if crashed else "ok",
        "error": crashed[0]["error"] if crashed else None,
        # The run's process died (a worker or torchrun launch that failed), rather than the Trainer raising.
        "process_failed": bool(crashed and crashed[0].get("process_failed")),
        "messages": candidate["messages"] if candidate else [],
        "other_warnings": candidate["other_warnings"] if candidate else [],
        "loss_scale_observed_by_repro": observed_a or observed_b,
        **compare_rows(history_a, history_b),
        "processes_hold_the_same_model": candidate.get("processes_hold_the_same_model") if candidate else None,
    }
    result["verdict"] = verdict(scenario, result)
    result["behaves_as_fixed"] = fork_behaves_as_fixed(scenario, result)
    return result


def compare_rows(history_a: list[dict], history_b: list[dict]) -> dict:
    """
    The step rows of a reference and a candidate log history, their comparison (`resume_diff`), and the candidate's
    skipped updates with those the LR advanced on: the parts of a variant's result that the verdicts read.
    """
    rows_a, rows_b = resume_diff.step_rows(history_a), resume_diff.step_rows(history_b)
    return {
        "reference_rows": rows_a,
        "candidate_rows": rows_b,
        "comparison": resume_diff.compare_histories(history_a, history_b),
        "lr_advanced_on_skipped_updates": resume_diff.lr_advanced_on_skipped_updates(rows_b),
        "skipped_steps": [step for step in rows_b if resume_diff.was_skipped(rows_b, step)],
    }


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def verdict(scenario: str, result: dict) -> str:
    """One line saying what happened in `scenario` for one variant."""
    if result["status"] == "crashed":
        # `crashed`: its process died, the scenario could not run; `crashes`: the Trainer raised (e.g. stock bf16).
        return f"{'crashed' if result.get('process_failed') else 'crashes'}: {result['error']}"
    parts = []
    comparison = result["comparison"]
    if scenario == "fused_skip":
        skipped, advanced = result["skipped_steps"], result["lr_advanced_on_skipped_updates"]
        if advanced:
            parts.append(
                f"LR advances on {len(advanced)} of {len(skipped)} skipped updates (steps {format_steps(advanced)})"
            )
        else:
            parts.append(f"LR held on all {len(skipped)} skipped updates")
    if scenario == "bf16_resume":
        parts.append(f"resumes in bf16 to step {max(result['candidate_rows'], default='-')}")
    if comparison["identical"]:
        parts.append(f"identical ({comparison['steps_compared']} steps, bit-exact)")
    else:
        divergence = comparison["divergence"]
        first = divergence["fields"][0]
        cause = f"; {divergence['cause']}" if divergence["cause"] else ""
        parts.append(
            f"diverges at step {divergence['step']} ({first['field']} {_short(first['a'])} -> {_short(first['b'])}"
            f"{cause})"
        )
    if result.get("processes_hold_the_same_model") is not None:
        same = result["processes_hold_the_same_model"]
        parts.append("both processes hold the same model" if same else "the two processes now train DIFFERENT models")
    if scenario in ("no_scaler_pt", "bf16_resume"):
        messages = result["messages"]
        parts.append(f"says: {_without_dirs(messages[0])}" if messages else "says nothing about the loss scale")
    return "; ".join(parts)


def format_steps(steps: list[int]) -> str:
    """`1, 2, 4`: steps in a verdict or a title."""
    return ", ".join(map(str, steps))


def _without_dirs(text: str) -> str:
    """Shortens the absolute paths in a message to their last components: `.../checkpoint-11/scaler.pt`."""
    return re.sub(r"/\S*/(checkpoint-\d+)", r".../\1", text)


def fork_behaves_as_fixed(scenario: str, result: dict) -> bool:
    """Whether a variant shows the fixed behavior in `scenario` (the fork must; stock is shown for contrast)."""
    if result["status"] != "ok":
        return False
    if scenario == "ddp_exact_resume":
        return result["comparison"]["identical"] and result["processes_hold_the_same_model"] is True
    if scenario == "exact_resume":
        return result["comparison"]["identical"]
    if scenario == "no_scaler_pt":
        return any(MISSING_SCALER_WARNING in message for message in result["messages"])
    if scenario == "bf16_resume":
        return bool(result["candidate_rows"]) and max(result["candidate_rows"]) == max(result["reference_rows"])
    if scenario == "fused_skip":
        rows_a, rows_b = result["reference_rows"], result["candidate_rows"]
        same_lr = all(
            resume_diff.values_equal(rows_a[step].get("learning_rate"), rows_b[step].get("learning_rate"))
            for step in rows_a
            if step in rows_b
        )
        return same_lr and not result["lr_advanced_on_skipped_updates"]
    raise ValueError(f"unknown scenario {scenario}")
