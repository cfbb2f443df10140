"""Per-step cost of the patch in a two-process DDP fp16 run, as a ratio to stock transformers.

Each launch starts two CPU processes with torchrun (gloo) that train the same tiny GPT-2 with fp16 autocast and a CPU
`GradScaler` (as the tests do), logging every step, with an overflow forced every 10 steps. A callback times each
training step in both processes, from one step's beginning to the next one's (forward, backward, all-reduce, optimizer
step, skip detection, logging). Stock (the pristine sources of the pinned releases, `build/stock/src`, left by `make fork`) and
the fork alternate launch by launch, `--repeats` times, in one run of this script (who goes first alternates too); the
ratio is fork / stock of the median step time (the first `--warmup` steps of each launch are left out), per repeat and
overall.

    .venv/bin/python bench/bench_ddp_step.py [--steps 60] [--warmup 10] [--repeats 3] [--out FILE]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "utils"))
from repro.workers import DEFAULT_STOCK_SRC, ensure_stock_src  # noqa: E402


STOCK_SRC = os.path.join(REPO_ROOT, DEFAULT_STOCK_SRC)
LAUNCH_TIMEOUT = 600
OVERFLOW_EVERY = 10


def train_and_time(steps, out):
    """Runs in each torchrun process: trains `steps` steps and writes this process's step times to `out`."""
    import torch

    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()

    class Dataset(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 64, (256, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class StepTimer(TrainerCallback):
        """Times whole training steps: from one step's beginning to the next one's (the last step to the end)."""

        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            now = time.perf_counter()
            if self.start is not None:
                self.times.append(now - self.start)
            self.start = now

        def on_train_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.start)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=16, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )
    args = TrainingArguments(
        output_dir=os.path.dirname(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        optim="adamw_torch_fused",
        fp16=True,
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    timer = StepTimer()
    trainer = Trainer(model, args, train_dataset=Dataset(), callbacks=[timer])
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
    trainer.accelerator.native_amp = True

    def overflow(grad):
        return torch.full_like(grad, float("inf")) if trainer.state.global_step % OVERFLOW_EVERY == 0 else grad

    model.get_input_embeddings().weight.register_hook(overflow)
    trainer.train()
    with open(f"{out}.rank{os.environ['RANK']}", "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__file__, "step_seconds": timer.times}, f)


def launch(variant, steps, out):
    """Starts two processes with torchrun for `variant`; returns the step times of both."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(([STOCK_SRC] if variant == "stock" else []) + paths)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}"]
    command += ["--max_restarts=0", os.path.abspath(__file__), "--ddp-run", str(steps), out]
    # torchrun never removes its log folders (`torchelastic_*`): they go to a temporary folder removed afterwards.
    env["TMPDIR"] = tempfile.mkdtemp(prefix="bench_ddp_")
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        returncode = launcher.wait(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        launcher.terminate()
        launcher.wait()
        raise SystemExit(f"the {variant} launch did not finish within {LAUNCH_TIMEOUT} s")
    finally:
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    if returncode != 0:
        raise SystemExit(f"the {variant} launch failed (torchrun exit status {returncode})")
    results = []
    for rank in (0, 1):
        with open(f"{out}.rank{rank}", encoding="utf-8") as f:
            result = json.load(f)
        is_stock = result["transformers"].startswith(STOCK_SRC + os.sep)
        if is_stock != (variant == "stock"):
            raise SystemExit(f"the {variant} launch imported {result['transformers']}")
        results.append(result["step_seconds"])
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON report to this file")
    parser.add_argument("--ddp-run", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ddp_run:
        train_and_time(int(args.ddp_run[0]), args.ddp_run[1])
        return
    ensure_stock_src(STOCK_SRC)
    medians = {"stock": [], "fork": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for variant in ("stock", "fork") if repeat % 2 == 0 else ("fork", "stock"):
                times = launch(variant, args.steps, os.path.join(tmp, f"{variant}-{repeat}", "times"))
                step_times = [t for process in times for t in process[args.warmup :]]
                medians[variant].append(statistics.median(step_times))
                print(f"repeat {repeat} {variant}: median step {medians[variant][-1] * 1e3:.2f} ms", file=sys.stderr)
    ratios = [fork / stock for stock, fork in zip(medians["stock"], medians["fork"])]
    report = {
        "steps": args.steps,
        "warmup": args.warmup,
        "overflow_every": OVERFLOW_EVERY,
        "stock_median_step_ms": [round(m * 1e3, 3) for m in medians["stock"]],
        "fork_median_step_ms": [round(m * 1e3, 3) for m in medians["fork"]],
        "ratio_per_repeat": [round(r, 4) for r in ratios],
        "ratio": round(statistics.median(medians["fork"]) / statistics.median(medians["stock"]), 4),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
