"""Per-step cost of the accelerate fused-skip patch on CPU, as a ratio to stock accelerate, and its host reads.

One process per (variant, model) trains with `AdamW(fused=True)`, a CPU `GradScaler` on a CPU `Accelerator` (as the
patch's tests do) and an `AcceleratedScheduler` (which reads `step_was_skipped` every step), an overflow injected every
4th step. Stock (`upstream-base` of the accelerate fork, extracted to a temporary folder) and the fork
(`build/accelerate/src`) alternate launch by launch, `--repeats` times, in one run of this script; the ratio is
patched / stock of the median step time (forward, backward, `optimizer.step()`, `scheduler.step()`, `zero_grad()`;
the first `--warmup` steps left out).

Step times are taken as wall time and as this process's CPU time (less disturbed by other work on shared cores).
A second pass per launch counts the tensor-to-host reads (`aten._local_scalar_dense`: `.item()`, `bool()`, `float()`
of a tensor) in `optimizer.step()` and in `scheduler.step()` per step: with the tensors on CUDA each is a host-device
synchronization; on CPU nothing synchronizes, so the CPU ratio cannot show that cost (`bench/gpu_check.py`'s
`fused_skip_cost` part measures it on a GPU). Each launch also reports how many of the injected overflows
`step_was_skipped` reported (stock misses them).

    .venv/bin/python bench/bench_fused_skip.py [--steps 120] [--warmup 20] [--repeats 3] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK = os.path.join(REPO_ROOT, "build", "accelerate")
MODELS = {"tiny": (16, 32, 16), "mid": (512, 1024, 1024, 512)}  # widths of an MLP: 1.1K and 2.1M parameters
OVERFLOW_EVERY = 4


def child(model_name, steps, warmup):
    """Runs in a fresh process with one accelerate on PYTHONPATH; prints one JSON line."""
    import accelerate
    import torch
    from accelerate import Accelerator
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(1)

    class HostReads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    def setup():
        torch.manual_seed(0)
        dims = MODELS[model_name]
        layers = [m for a, b in zip(dims, dims[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())][:-1]
        model = torch.nn.Sequential(*layers)
        accelerator = Accelerator(cpu=True)
        accelerator.scaler = torch.amp.GradScaler("cpu")  # what mixed_precision="fp16" creates on an accelerator
        optimizer = torch.optim.AdamW(model.parameters(), 1e-3, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        x, y = torch.randn(64, dims[0]), torch.randn(64, dims[-1])
        return accelerator, model, optimizer, scheduler, x, y

    def step(run, i, counts=None):
        accelerator, model, optimizer, scheduler, x, y = run
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        if i % OVERFLOW_EVERY == OVERFLOW_EVERY - 1:
            next(model.parameters()).grad.view(-1)[0] = float("inf")
        for name, call in (("optimizer_step", optimizer.step), ("scheduler_step", scheduler.step)):
            if counts is None:
                call()
                continue
            with HostReads() as mode:
                call()
            counts[name] = counts.get(name, 0) + mode.count
        skipped = optimizer.step_was_skipped
        optimizer.zero_grad(set_to_none=True)
        return skipped

    run, wall, cpu, reported = setup(), [], [], 0
    for i in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        reported += step(run, i)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    run, counts = setup(), {}
    for i in range(2 * OVERFLOW_EVERY):
        step(run, i, counts)
    return {
        "accelerate_file": accelerate.__file__,
        "median_step_ms": statistics.median(wall[warmup:]) * 1e3,
        "median_step_cpu_ms": statistics.median(cpu[warmup:]) * 1e3,
        "injected_overflows": steps // OVERFLOW_EVERY,
        "reported_skipped": reported,
        "host_reads_per_step": {name: n / (2 * OVERFLOW_EVERY) for name, n in counts.items()},
    }


def launch(src, model_name, steps, warmup):
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model_name, "--steps", str(steps)]
    out = subprocess.run(cmd + ["--warmup", str(warmup)], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["accelerate_file"].startswith(src):
        raise RuntimeError(f"imported {result['accelerate_file']}, not the accelerate under {src}")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--child", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.warmup)))
        return 0

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", FORK, "archive", "upstream-base", "src"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        srcs = {"stock": os.path.join(tmp, "src"), "patched": os.path.join(FORK, "src")}
        runs = {model: {variant: [] for variant in srcs} for model in MODELS}
        for r in range(args.repeats):
            for model in MODELS:
                for variant in sorted(srcs, reverse=r % 2 == 1):  # patched, stock, stock, patched, ...
                    runs[model][variant].append(launch(srcs[variant], model, args.steps, args.warmup))

    load = (load_before, os.getloadavg()[0])
    report = {"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "load_avg_1min": load, "models": {}}
    print(f"load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    for model, by_variant in runs.items():
        summary = {}
        for key in ("median_step_ms", "median_step_cpu_ms"):
            med = {v: statistics.median(run[key] for run in rs) for v, rs in by_variant.items()}
            pairs = [p[key] / s[key] for p, s in zip(by_variant["patched"], by_variant["stock"])]
            summary[key] = {**med, "ratio": med["patched"] / med["stock"], "ratio_per_repeat": pairs}
            print(
                f"{model} {key}: stock {med['stock']:.3f}, patched {med['patched']:.3f}, ratio "
                f"{med['patched'] / med['stock']:.3f} (per repeat {', '.join(f'{p:.3f}' for p in pairs)})"
            )
        for v, rs in by_variant.items():
            summary[v] = {key: rs[0][key] for key in ("injected_overflows", "reported_skipped", "host_reads_per_step")}
            print(
                f"  {v}: skips reported {rs[0]['reported_skipped']} of {rs[0]['injected_overflows']}; host reads per "
                f"step {rs[0]['host_reads_per_step']}"
            )
        report["models"][model] = summary
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
