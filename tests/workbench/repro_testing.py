"""Shared by the test_repro_*.py files (utils/ on the path): step rows, a variant's result made of them, a script."""

import sys

from repro import verdicts


ROWS = {
    1: {"learning_rate": 1e-5, "loss": 5.0, "grad_norm": 1.0, "grad_scale": 8192.0, "num_skipped_updates": 0},
    2: {"learning_rate": 9e-6, "loss": 4.9, "grad_norm": 1.1, "grad_scale": 8192.0, "num_skipped_updates": 0},
}


def result(rows_a, rows_b, status="ok", messages=(), error=None):
    history_a = [{**row, "step": step} for step, row in rows_a.items()]
    history_b = [{**row, "step": step} for step, row in rows_b.items()]
    return {
        "status": status,
        "error": error,
        "messages": list(messages),
        **verdicts.compare_rows(history_a, history_b),
    }


def write_script(path, text):
    path.write_text(text, encoding="utf-8")
    return [sys.executable, str(path)]
