"""Per-step cost of deciding whether an fp16 update was skipped (`SkippedUpdatesMonitor`) against the stock step.

The stock step is what `Trainer` runs with fp16: `scaler.step(optimizer)` and `scaler.update()` (inside Accelerate's
optimizer wrapper), then it reads `accelerator.optimizer_step_was_skipped`. The patched step asks
`SkippedUpdatesMonitor.optimizer_step_was_skipped()` instead, which reads the same flag and, for AMP-aware (fused)
optimizers with an Accelerate release that misses their skips, one scalar of the scaler. Both variants run in the same
process, alternating step by step on the same model and gradients, so their ratio is comparable across machines.

    .venv/bin/python bench/bench_skip_detection.py [--steps 300] [--repeats 7] [--device cpu|cuda] [--out FILE]
"""

import argparse
import json
import statistics
import sys
import time

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer

from transformers import TrainerState
from transformers.trainer_skipped_updates import SkippedUpdatesMonitor


class _Accelerator:
    """The two attributes of `Accelerator` the monitor reads, for one optimizer."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.scaler = optimizer.scaler

    @property
    def optimizer_step_was_skipped(self):
        return self.optimizer.step_was_skipped


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(device, optim_kwargs, steps, overflow_every):
    """Runs `steps` optimizer steps, alternating stock and patched, and returns their mean time per step (stock, patched)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).to(device)
    scaler = torch.amp.GradScaler(device.type)
    optimizer = AcceleratedOptimizer(torch.optim.AdamW(model.parameters(), **optim_kwargs), scaler=scaler)
    scaler.scale(model(torch.randn(8, 512, device=device)).sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    monitor, state = SkippedUpdatesMonitor(_Accelerator(optimizer), optimizer), TrainerState()
    elapsed = [0.0, 0.0]
    for step in range(steps):
        with_monitor = step % 2
        for p, g in zip(model.parameters(), grads):
            p.grad.copy_(g)
        if overflow_every and (step // 2) % overflow_every == 0:
            model[0].weight.grad[0, 0] = float("inf")
        _synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        if with_monitor:
            monitor.optimizer_step_was_skipped(state)
        else:
            optimizer.step_was_skipped  # noqa: B018 (what the stock Trainer reads)
        _synchronize(device)
        elapsed[with_monitor] += time.perf_counter() - start
    return elapsed[0] / (steps // 2), elapsed[1] / (steps // 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="also write the JSON report to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    Accelerator(cpu=device.type == "cpu")  # the optimizer wrapper reads the accelerator state
    results = []
    for name, optim_kwargs in (("adamw_torch (foreach)", {"foreach": True}), ("adamw_torch_fused", {"fused": True})):
        for overflow_every in (0, 10):
            stock, patched = [], []
            for _ in range(args.repeats):
                stock_s, patched_s = time_steps(device, optim_kwargs, args.steps, overflow_every)
                stock.append(stock_s)
                patched.append(patched_s)
            stock_s, patched_s = statistics.median(stock), statistics.median(patched)
            results.append(
                {
                    "optimizer": name,
                    "overflow_every": overflow_every or None,
                    "stock_step_ms": round(stock_s * 1e3, 4),
                    "patched_step_ms": round(patched_s * 1e3, 4),
                    "added_us_per_step": round((patched_s - stock_s) * 1e6, 2),
                    "ratio": round(patched_s / stock_s, 4),
                }
            )
    report = {"device": str(device), "torch": torch.__version__, "steps": args.steps, "results": results}
    print(f"{'optimizer':<24}{'overflow':>10}{'stock ms':>11}{'patched ms':>12}{'added us':>10}{'ratio':>8}")
    for r in results:
        overflow = f"1/{r['overflow_every']}" if r["overflow_every"] else "none"
        print(
            f"{r['optimizer']:<24}{overflow:>10}{r['stock_step_ms']:>11.3f}{r['patched_step_ms']:>12.3f}"
            f"{r['added_us_per_step']:>10.1f}{r['ratio']:>8.3f}"
        )
    json.dump(report, sys.stdout if not args.out else open(args.out, "w", encoding="utf-8"), indent=2)
    print()


if __name__ == "__main__":
    main()
