"""
Compare two Trainer runs step by step and explain the first divergence.

Usage:

    python utils/resume_diff.py A B [--json] [--rtol RTOL]

A and B are each a run's output directory or a `trainer_state.json` file. For a directory, its top-level
`trainer_state.json` is used when present (written by `Trainer.save_state()`), else the one of its latest
`checkpoint-N`. Typically A is an uninterrupted run and B the same run resumed from a checkpoint.

What is compared: the per-step entries of `log_history` (the training logs: `loss`, `learning_rate`, `grad_norm`,
`epoch`, `grad_scale` where the Trainer logs it, `num_skipped_updates` where `utils/repro` observed it; evaluation logs at
the same step are merged in). Values must be equal (bit-exact by default, `--rtol` relaxes floats); two NaNs are equal.
A field that only one of the two runs ever logs (e.g. a stock run's `repro_grad_scale` against the fork's `grad_scale`)
is not compared: the report names it as logged by that run only, and it is never a cause of divergence.

What is ignored, and why:
- timing fields (`*_runtime`, `*_per_second`): they measure the machine, not the training;
- the end-of-training summary entry (the one with `train_runtime`, `train_loss`, `total_flos`): `train_loss` averages
  only the steps run by the last process, so it differs after any resume even when every step matches.

The first divergence is the first step where a field differs or only one run has a log entry. Its fields are listed
in causal order within a step (`learning_rate` is fixed before the step, `loss` comes from the forward pass,
`grad_norm` from the backward pass, `grad_scale` and `num_skipped_updates` from the optimizer step). Recognized
likely causes:
- `precision_changed`: both runs log `grad_scale`, and from that step on one of them no longer does (e.g. fp16
  resumed as bf16);
- `loss_scale_reset`: the loss scale jumped back up at that step, or the gradients overflowed in one run only: the
  fp16 loss scale restarted at its initial value after resume (no `scaler.pt` restored, transformers#34053);
- `lr_advanced_on_skipped_update`: the learning rate moved after an update that was skipped (overflow), i.e. the
  scheduler stepped although the optimizer did not (fused optimizers before the fix);
- `data_or_rng`: the loss differs while the learning rate and loss scale agree: the batch or the dropout RNG differs
  (data order or RNG state not restored), or the weights do;
- `run_incomplete`: one run has no logs from that step on (it crashed or was stopped).

Exit status: 0 identical, 1 diverged, 2 bad input (missing, unreadable or malformed file, or no per-step log entry).
"""

import argparse
import json
import math
import os
import re
import sys

from workbench.args import Parser


TRAINER_STATE_NAME = "trainer_state.json"

# Fields in the order they are determined within one optimizer step; other fields follow, sorted by name.
CAUSAL_FIELD_ORDER = ("learning_rate", "loss", "grad_norm", "grad_scale", "num_skipped_updates", "epoch")

# Keys of the end-of-training summary entry, which is skipped (see the module docstring).
SUMMARY_KEYS = ("train_runtime", "train_loss")


class ResumeDiffError(ValueError):
    """A run cannot be read: the message names the path and what is wrong."""


def is_ignored_field(name: str) -> bool:
    """Whether a log field is not compared: the step key itself and timing fields."""
    return name == "step" or name.endswith("_runtime") or name.endswith("_per_second")


def find_trainer_state(path: str) -> str:
    """
    Returns the `trainer_state.json` to read for `path`: the file itself, a directory's top-level one, or the one of
    its latest `checkpoint-N`. Raises `ResumeDiffError` when there is none, or when `path` is not a path at all (e.g.
    `None` for a run that crashed before it had an output directory).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ResumeDiffError(f"no run to read: a path (directory or {TRAINER_STATE_NAME}) is needed, got {path!r}")
    path = os.fspath(path)
    if not path:
        raise ResumeDiffError(f"no run to read: the path is empty (pass a directory or a {TRAINER_STATE_NAME})")
    if os.path.isfile(path):
        return path
    if not os.path.exists(path):
        raise ResumeDiffError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise ResumeDiffError(f"{path}: not a file or a directory")
    top_level = os.path.join(path, TRAINER_STATE_NAME)
    if os.path.isfile(top_level):
        return top_level
    try:
        names = os.listdir(path)
    except OSError as error:
        raise ResumeDiffError(f"{path}: directory cannot be listed ({error})") from None
    checkpoints = []
    for name in names:
        match = re.fullmatch(r"checkpoint-(\d+)", name)
        if match and os.path.isfile(os.path.join(path, name, TRAINER_STATE_NAME)):
            checkpoints.append((int(match.group(1)), name))
    if not checkpoints:
        raise ResumeDiffError(
            f"{path}: directory has no {TRAINER_STATE_NAME} and no checkpoint-N/{TRAINER_STATE_NAME} "
            "(pass a run's output directory, a checkpoint directory or a trainer_state.json file)"
        )
    return os.path.join(path, max(checkpoints)[1], TRAINER_STATE_NAME)


def load_log_history(path: str) -> tuple[list[dict], str]:
    """
    Reads the `log_history` of a run (see `find_trainer_state`). Returns it with the path of the file read.
    Raises `ResumeDiffError` for a missing or unreadable file, invalid JSON, a missing or malformed `log_history`
    (see `check_log_history`) or one without any per-step entry.
    """
    state_file = find_trainer_state(path)
    try:
        with open(state_file, encoding="utf-8") as f:
            state = json.load(f)
    except (json.JSONDecodeError, RecursionError) as error:
        raise ResumeDiffError(f"{state_file}: invalid JSON ({error})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ResumeDiffError(f"{state_file}: cannot be read ({error})") from None
    if not isinstance(state, dict) or "log_history" not in state:
        raise ResumeDiffError(f"{state_file}: no 'log_history' key, this is not a Trainer state file")
    history = state["log_history"]
    check_log_history(history, state_file)
    if not step_rows(history):
        raise ResumeDiffError(
            f"{state_file}: 'log_history' has no per-step entry (it is empty or holds only the end-of-training "
            "summary), nothing to compare"
        )
    return history, state_file


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_log_history(history, source: str) -> None:
    """
    Checks the structure the comparison relies on: `history` is a list of objects, each `step` an integer and each
    `num_skipped_updates` a number. Raises `ResumeDiffError` naming `source` and the entry's index otherwise.
    """
    if not isinstance(history, list):
        raise ResumeDiffError(f"{source}: 'log_history' must be a list of objects")
    for index, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise ResumeDiffError(f"{source}: 'log_history' must be a list of objects (entry {index} is not)")
        if "step" in entry and not _is_integer(entry["step"]):
            raise ResumeDiffError(
                f"{source}: log_history entry {index}: 'step' must be an integer, got {entry['step']!r}"
            )
        if "num_skipped_updates" in entry and not _is_number(entry["num_skipped_updates"]):
            raise ResumeDiffError(
                f"{source}: log_history entry {index}: 'num_skipped_updates' must be a number, "
                f"got {entry['num_skipped_updates']!r}"
            )


def step_rows(log_history: list[dict]) -> dict[int, dict]:
    """Returns the compared fields of each logged step, `{step: {field: value}}`, in step order."""
    rows = {}
    for entry in log_history:
        if "step" not in entry or any(key in entry for key in SUMMARY_KEYS):
            continue
        row = rows.setdefault(int(entry["step"]), {})
        row.update({key: value for key, value in entry.items() if not is_ignored_field(key)})
    return dict(sorted(rows.items()))


def values_equal(a, b, rtol: float = 0.0) -> bool:
    """Whether two logged values are equal: exactly, or within `rtol` for floats. Two NaNs are equal."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or (rtol > 0 and math.isclose(a, b, rel_tol=rtol))
    return a == b


def field_order(names) -> list[str]:
    """Sorts field names in causal order (see `CAUSAL_FIELD_ORDER`), then by name."""
    rank = {name: i for i, name in enumerate(CAUSAL_FIELD_ORDER)}
    return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


MISSING = "<missing>"


def differing_fields(row_a: dict, row_b: dict, rtol: float = 0.0) -> list[dict]:
    """Returns `[{"field", "a", "b"}]` for the fields of one step that differ; an absent field reads `<missing>`."""
    differences = []
    for name in field_order(set(row_a) | set(row_b)):
        a, b = row_a.get(name, MISSING), row_b.get(name, MISSING)
        if not values_equal(a, b, rtol):
            differences.append({"field": name, "a": a, "b": b})
    return differences


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _previous_step(rows: dict[int, dict], step: int) -> int | None:
    earlier = [s for s in rows if s < step]
    return max(earlier) if earlier else None


def was_skipped(rows: dict[int, dict], step: int) -> bool:
    """
    Whether the update of `step` was skipped: `num_skipped_updates` grew at that step, or, when it is not logged, the
    gradient norm is inf/NaN (with fp16 loss scaling an overflowing step is skipped).
    """
    row = rows[step]
    if "num_skipped_updates" in row:
        previous = _previous_step(rows, step)
        before = rows[previous].get("num_skipped_updates", 0) if previous is not None else 0
        return row["num_skipped_updates"] > before
    return "grad_norm" in row and not _is_finite_number(row["grad_norm"])


def lr_advanced_on_skipped_updates(rows: dict[int, dict]) -> list[int]:
    """
    Returns the steps whose update was skipped yet the learning rate of the next logged step differs: the scheduler
    advanced on an update that did not happen. Needs logging at every step to be exact.
    """
    steps = list(rows)
    advanced = []
    for step, next_step in zip(steps, steps[1:]):
        lr, next_lr = rows[step].get("learning_rate"), rows[next_step].get("learning_rate")
        if next_step == step + 1 and was_skipped(rows, step) and lr is not None and not values_equal(lr, next_lr):
            advanced.append(step)
    return advanced


def _explain_lr_change(rows_a: dict, rows_b: dict, step: int) -> dict | None:
    for name, rows in (("A", rows_a), ("B", rows_b)):
        previous = step - 1
        if previous in rows and step in rows and previous in lr_advanced_on_skipped_updates(rows):
            lr_before, lr_now = rows[previous].get("learning_rate"), rows[step].get("learning_rate")
            return {
                "cause": "lr_advanced_on_skipped_update",
                "explanation": (
                    f"in {name}, the update of step {previous} was skipped (gradient overflow) yet the learning rate "
                    f"moved from {lr_before!r} to {lr_now!r}: the scheduler advanced on an update the optimizer "
                    "skipped (a fused optimizer such as adamw_torch_fused skips by itself, unseen by a Trainer that "
                    "only trusts accelerator.optimizer_step_was_skipped)"
                ),
            }
    return None


def _explain_loss_scale(rows_a: dict, rows_b: dict, step: int, fields: dict) -> dict | None:
    if "grad_scale" in fields and MISSING in (fields["grad_scale"]["a"], fields["grad_scale"]["b"]):
        without = "B" if fields["grad_scale"]["b"] == MISSING else "A"
        return {
            "cause": "precision_changed",
            "explanation": (
                f"{without} logs no grad_scale from step {step} on: it ran without fp16 loss scaling, so the precision "
                "changed (e.g. an fp16 checkpoint resumed in bf16 or fp32) and the runs are not expected to match"
            ),
        }
    for name, rows, other in (("B", rows_b, rows_a), ("A", rows_a, rows_b)):
        scale, other_scale = rows[step].get("grad_scale"), other[step].get("grad_scale")
        previous = _previous_step(rows, step)
        previous_scale = rows[previous].get("grad_scale") if previous is not None else None
        if _is_finite_number(scale) and _is_finite_number(other_scale) and _is_finite_number(previous_scale):
            if scale > other_scale and scale > previous_scale:
                return {
                    "cause": "loss_scale_reset",
                    "explanation": (
                        f"{name}'s loss scale jumped back up from {previous_scale:g} to {scale:g} at step {step} "
                        f"(the other run: {other_scale:g}): the fp16 loss scale restarted at its initial value after "
                        "resume (scaler state not restored, e.g. a checkpoint without scaler.pt), so the next "
                        "updates overflow and are skipped (transformers#34053)"
                    ),
                }
    if "grad_norm" in fields:
        a, b = fields["grad_norm"]["a"], fields["grad_norm"]["b"]
        if _is_finite_number(a) != _is_finite_number(b):
            name = "A" if _is_finite_number(b) else "B"
            return {
                "cause": "loss_scale_reset",
                "explanation": (
                    f"{name}'s gradients overflowed at step {step} (grad_norm {a if name == 'A' else b!r}) while the "
                    "other run's did not: with fp16 this typically means its loss scale restarted at its initial "
                    "value after resume (scaler state not restored, e.g. a checkpoint without scaler.pt; "
                    "transformers#34053)"
                ),
            }
    return None


def likely_cause(rows_a: dict[int, dict], rows_b: dict[int, dict], divergence: dict) -> dict | None:
    """Returns `{"cause", "explanation"}` for a recognized cause of `divergence` (see the module docstring)."""
    step = divergence["step"]
    fields = {difference["field"]: difference for difference in divergence["fields"]}
    if step not in rows_a or step not in rows_b:
        name, last = ("B", _previous_step(rows_b, step)) if step not in rows_b else ("A", _previous_step(rows_a, step))
        last = f"its last one is step {last}" if last is not None else "nor any before it"
        return {
            "cause": "run_incomplete",
            "explanation": f"{name} has no log entry for step {step} ({last}): the run stopped there (crashed or "
            "interrupted) or logs at other steps",
        }
    explanation = _explain_loss_scale(rows_a, rows_b, step, fields)
    if explanation is None and "learning_rate" in fields:
        explanation = _explain_lr_change(rows_a, rows_b, step)
    if explanation is None and "loss" in fields and "learning_rate" not in fields and "grad_scale" not in fields:
        explanation = {
            "cause": "data_or_rng",
            "explanation": (
                f"the loss differs at step {step} while the learning rate and loss scale agree: the batch or the "
                "dropout RNG differs (data order or RNG state not restored on resume), or the weights differ"
            ),
        }
    return explanation


def compare_histories(history_a: list[dict], history_b: list[dict], rtol: float = 0.0) -> dict:
    """
    Compares two `log_history` lists step by step.

    Returns a dict: `identical` (bool), `steps_compared` (steps logged by both), `fields_compared`, `only_in_a` and
    `only_in_b` (the fields only that run ever logs, not compared), and `divergence`:
    `None`, or `{"step", "fields": [{"field", "a", "b"}], "cause", "explanation"}` for the first step where the runs
    differ (`cause` and `explanation` are `None` when no likely cause is recognized).
    """
    rows_a, rows_b = step_rows(history_a), step_rows(history_b)
    logged_a = {name for row in rows_a.values() for name in row}
    logged_b = {name for row in rows_b.values() for name in row}
    only_a, only_b = field_order(logged_a - logged_b), field_order(logged_b - logged_a)
    rows_a = {step: {k: v for k, v in row.items() if k not in only_a} for step, row in rows_a.items()}
    rows_b = {step: {k: v for k, v in row.items() if k not in only_b} for step, row in rows_b.items()}
    common = [step for step in rows_a if step in rows_b]
    fields = field_order({name for step in common for name in (*rows_a[step], *rows_b[step])})
    divergence = None
    for step in sorted(set(rows_a) | set(rows_b)):
        if step not in rows_a or step not in rows_b:
            present = "a" if step in rows_a else "b"
            difference = {
                "field": "step",
                "a": step if present == "a" else MISSING,
                "b": step if present == "b" else MISSING,
            }
            divergence = {"step": step, "fields": [difference]}
            break
        differences = differing_fields(rows_a[step], rows_b[step], rtol)
        if differences:
            divergence = {"step": step, "fields": differences}
            break
    if divergence is not None:
        divergence.update(likely_cause(rows_a, rows_b, divergence) or {"cause": None, "explanation": None})
    return {
        "identical": divergence is None,
        "steps_compared": len(common),
        "fields_compared": fields,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "divergence": divergence,
    }


def json_safe(value):
    """Returns `value` with inf/NaN floats as the strings "inf", "-inf", "nan", so that it is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def format_report(result: dict, source_a: str, source_b: str) -> str:
    """Returns the human-readable report of `compare_histories`'s result."""
    lines = [
        f"A: {source_a}",
        f"B: {source_b}",
        f"compared {result['steps_compared']} logged steps, fields: {', '.join(result['fields_compared']) or '-'}",
    ]
    for name, only in (("A", result["only_in_a"]), ("B", result["only_in_b"])):
        if only:
            lines.append(f"not compared, logged by {name} only: {', '.join(only)}")
    divergence = result["divergence"]
    if divergence is None:
        lines.append("identical: every logged step matches")
        return "\n".join(lines)
    lines.append(f"first divergence at step {divergence['step']}:")
    lines.extend(f"  {d['field']}: A={d['a']!r}  B={d['b']!r}" for d in divergence["fields"])
    if divergence["cause"] is not None:
        lines.append(f"likely cause ({divergence['cause']}): {divergence['explanation']}")
    else:
        lines.append("likely cause: not recognized")
    return "\n".join(lines)


def relative_tolerance(text: str) -> float:
    """Parses `--rtol`: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        description="Compare two Trainer runs step by step (log_history of trainer_state.json) and report the first "
        "divergence with its likely cause. Exit status: 0 identical, 1 diverged, 2 bad input."
    )
    parser.add_argument("a", help="run output directory, checkpoint directory or trainer_state.json (reference)")
    parser.add_argument("b", help="run output directory, checkpoint directory or trainer_state.json (e.g. resumed)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--rtol", type=relative_tolerance, default=0.0, help="relative tolerance for floats (default: bit-exact)"
    )
    args = parser.parse_args(argv)
    try:
        history_a, source_a = load_log_history(args.a)
        history_b, source_b = load_log_history(args.b)
    except ResumeDiffError as error:
        print(f"resume_diff: error: {error}", file=sys.stderr)
        return 2
    result = compare_histories(history_a, history_b, rtol=args.rtol)
    if args.json:
        print(json.dumps(json_safe({"a": source_a, "b": source_b, **result}), indent=2))
    else:
        print(format_report(result, source_a, source_b))
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
