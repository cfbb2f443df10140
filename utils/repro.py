"""
Reproduce transformers#34053 offline, against stock transformers and against the fork, side by side.

Usage (what `make repro` runs):

    .venv/bin/python utils/repro.py [--out build/repro] [--steps 20] [--resume-step 11] [--scenarios ...]
                                    [--device auto|cpu|cuda] [--stock-src build/stock/src] [--variants stock,fork]

#34053: with fp16 mixed precision, the `GradScaler` loss scale was not saved in checkpoints. After a resume it
restarted at 65536, the gradients overflowed, the updates were skipped, the LR scheduler paused, and the LR and loss
curves no longer matched the uninterrupted run.

The setup follows the reporters: a run of `--steps` steps (cosine schedule, batch 4, lr 1e-5, fp16, logging and a
checkpoint at every step), then the same run resumed from `checkpoint-<resume-step>` with the later checkpoints gone
(the checkpoint is copied into a fresh output directory). Everything is offline: a tiny GPT-2 built from a config
(seeded), the prompts of `utils/data/prompts.txt` encoded by a byte-level tokenizer defined here.

Scenarios (`--scenarios`, default all):

- `exact_resume`: resume with the same settings. Must match the uninterrupted run bit for bit.
- `no_scaler_pt`: resume from a checkpoint without `scaler.pt` (as saved by transformers <= 4.48). The loss scale
  restarts at 65536 and the run cannot match; stock says nothing, the fork warns.
- `bf16_resume`: resume the fp16 checkpoint with bf16. Stock crashes in `_load_scaler` (the run has no scaler); the
  fork resumes and says at info level that the saved loss scale is not used.
- `fused_skip`: two uninterrupted runs, `adamw_torch` and the default `adamw_torch_fused`, with overflows forced at
  `--overflow-steps`. A fused optimizer skips overflowing updates itself, so stock's Trainer does not see the skip and
  advances the LR schedule anyway; the fork holds it, like with `adamw_torch`.
- `ddp_exact_resume`: the run of `exact_resume` in two processes (DDP over gloo, on CPU, started with torchrun), then
  resumed from the same checkpoint. Must match bit for bit, and both processes must hold the same model.

Choices made to see the bug on a tiny model:

- Overflow at the stock loss scale: the model is initialized with `initializer_range=1.0`, which makes its fp16
  activations and gradients large, so -- like the reporters' models -- a loss scale of 65536 overflows. The
  `GradScaler` keeps its defaults (init_scale 65536, growth_interval 2000): it backs off to 8192 within the first
  steps (a few skipped updates), then stays there. With the default `initializer_range=0.02` the tiny model never
  overflows at 65536 and a lost loss scale goes unnoticed. The uninterrupted and resumed runs are otherwise
  identical, so an exact resume is bit-exact.
- Forced overflows (`fused_skip`): a hook on the input embedding's weight replaces its gradient with inf during the
  backward pass of the chosen steps. The scaler then finds inf, skips the update and halves the scale, exactly as for
  a natural overflow, at steps chosen in the middle of the schedule where the LR visibly moves.
- fp16 on CPU: accelerate builds no `GradScaler` on CPU, so `fp16=True` alone would silently train in fp32. On CPU
  each fp16 run sets `trainer.accelerator.native_amp = True` (accelerate then wraps the forward in
  `torch.autocast("cpu", torch.float16)`) and `trainer.accelerator.scaler = torch.amp.GradScaler("cpu")` before
  `train()`. With a CUDA device (`--device auto` picks it) the runs use plain `fp16=True`, no such adjustment.
- Stock Trainers do not log the loss scale, and no Trainer logs a count of skipped updates. A callback of this script
  counts the updates where the scale backed off (skipped updates) into the log entries of every fp16 run, as
  `repro_num_skipped_updates`, and records the scale in those of runs that do not log `loss_scale` themselves, as
  `repro_loss_scale`; tables and comparisons show them as `num_skipped_updates` / `loss_scale`, marked as observed.

Stock and fork run in separate worker processes of this script (in parallel), the stock one with
`PYTHONPATH=<stock src>` so that it imports the pristine sources; each worker runs all its scenarios. When the default
stock source directory is missing it is extracted from the forks' `upstream-base` tags (`git archive`, read-only):
stock transformers and, when its fork exists, stock accelerate.

Output, under `--out`: `<variant>/<scenario>/...` run directories (compare any two with `utils/resume_diff.py`),
`report.json` (settings, per scenario and variant: status, messages, step rows, first divergence with its likely
cause, verdict), `repro.png` (learning rate, loss and loss scale against the step, reference vs candidate, stock vs
fork, one row per scenario). The console shows progress, a per-step table per scenario and variant, and the verdicts.

A run that cannot finish because its process dies (a worker, or a torchrun launch: a process that crashed or
exited with an error) does not stop the others: that scenario's verdict says `crashed: <why>` (the exit status or
signal, torchrun's root cause, the last error line), and the other scenarios' tables, `report.json` and `repro.png`
are still written. A Trainer that raises is a finding instead (`crashes: <error>`, e.g. stock with bf16).

Exit status: 0 when the fork behaves as fixed in every scenario run (exact resume identical, warning without
`scaler.pt`, no crash with bf16, LR held on skipped updates), 1 otherwise (a fork scenario that crashed included), 2 on
a usage or setup error.
"""

import argparse
import collections
import gc
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resume_diff  # noqa: E402


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS_FILE = os.path.join(REPO_ROOT, "utils", "data", "prompts.txt")
FORK_DIR = os.path.join(REPO_ROOT, "build", "transformers")
# accelerate is a second upstream of the workbench: stock means stock accelerate too (the default stock directory
# holds both pristine source trees).
ACCELERATE_FORK_DIR = os.path.join(REPO_ROOT, "build", "accelerate")
DEFAULT_STOCK_SRC = os.path.join("build", "stock", "src")
STOCK_TAG = "upstream-base"
VARIANTS = ("stock", "fork")

SEQUENCE_LENGTH = 32
BATCH_SIZE = 4
LEARNING_RATE = 1e-5
SEED = 0
INITIALIZER_RANGE = 1.0  # large enough for fp16 gradients to overflow at a loss scale of 65536 (see docstring)

# name -> (title, reference run, candidate run, short labels for both)
SCENARIOS = {
    "exact_resume": (
        "exact resume from checkpoint-{r}",
        "uninterrupted",
        "exact_resume",
        ("uninterrupted", "resumed"),
    ),
    "no_scaler_pt": (
        "resume from checkpoint-{r} without scaler.pt (legacy checkpoint)",
        "uninterrupted",
        "no_scaler_pt",
        ("uninterrupted", "resumed"),
    ),
    "bf16_resume": (
        "resume the fp16 checkpoint-{r} with bf16",
        "uninterrupted",
        "bf16_resume",
        ("uninterrupted fp16", "resumed bf16"),
    ),
    "fused_skip": (
        "overflows forced at steps {o}: adamw_torch vs adamw_torch_fused",
        "fused_skip/adamw_torch",
        "fused_skip/adamw_torch_fused",
        ("adamw_torch", "adamw_torch_fused"),
    ),
    "ddp_exact_resume": (
        "2 processes (DDP): exact resume from checkpoint-{r}",
        "ddp/uninterrupted",
        "ddp/exact_resume",
        ("uninterrupted", "resumed"),
    ),
}
RESUME_SCENARIOS = ("exact_resume", "no_scaler_pt", "bf16_resume")
DDP_SCENARIOS = ("ddp_exact_resume",)
DDP_TIMEOUT = 600  # seconds for the two-process runs of one variant
TABLE_FIELDS = ("learning_rate", "loss", "grad_norm", "loss_scale", "num_skipped_updates")
PROBE_FIELDS = {"repro_loss_scale": "loss_scale", "repro_num_skipped_updates": "num_skipped_updates"}
MISSING_SCALER_WARNING = "the fp16 loss scale restarts at"
# Messages about loss scaling (whole words: run directories such as `no_scaler_pt` must not match).
LOSS_SCALE_MESSAGE = re.compile(r"\bloss scale\b|\bscaler\b|GradScaler", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------------------------
# Data: the project's prompts, byte-level tokenized.


def encode(text: str, length: int = SEQUENCE_LENGTH) -> tuple[list[int], list[int]]:
    """Byte-level tokenizer: UTF-8 bytes shifted by one (0 is padding), truncated or padded to `length`."""
    ids = [byte + 1 for byte in text.encode("utf-8")][:length]
    mask = [1] * len(ids) + [0] * (length - len(ids))
    return ids + [0] * (length - len(ids)), mask


def load_prompts(path: str = PROMPTS_FILE) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def make_dataset(prompts: list[str]) -> list[dict]:
    """Returns the training examples: input_ids, attention_mask and labels (-100 on padding) as tensors."""
    import torch

    examples = []
    for prompt in prompts:
        ids, mask = encode(prompt)
        labels = [token if keep else -100 for token, keep in zip(ids, mask)]
        examples.append(
            {
                "input_ids": torch.tensor(ids),
                "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(labels),
            }
        )
    return examples


# ---------------------------------------------------------------------------------------------------------------------
# Worker: runs one variant's scenarios in this process (stock or fork, whichever `transformers` imports).


class _MessageCapture(logging.Handler):
    """
    Keeps the transformers messages of the current run: those about the loss scale or scaler (any level from info)
    in `messages`, the other warnings in `other_warnings`.
    """

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.reset()

    def reset(self):
        self.messages, self.other_warnings = [], []

    def emit(self, record):
        message = f"{record.levelname}: {record.getMessage()}"
        if LOSS_SCALE_MESSAGE.search(message):
            self.messages.append(message)
        elif record.levelno >= logging.WARNING:
            self.other_warnings.append(message)


def _make_probe_callback(trainer):
    """
    Returns a callback that adds `repro_num_skipped_updates` to the log entries of an fp16 run, and `repro_loss_scale`
    to those of a run that does not log `loss_scale` itself (stock). An update counts as skipped when the scale backed
    off during the step. Assumes logging at every step.
    """
    from transformers import TrainerCallback

    class LossScaleProbe(TrainerCallback):
        def __init__(self):
            self.scale_before = None
            self.skipped = False

        def _scaler(self):
            scaler = trainer.accelerator.scaler
            return scaler if scaler is not None and scaler.is_enabled() else None

        def on_step_begin(self, args, state, control, **kwargs):
            if self._scaler() is not None:
                self.scale_before = self._scaler().get_scale()

        def on_step_end(self, args, state, control, **kwargs):
            if self._scaler() is not None and self.scale_before is not None:
                self.skipped = self._scaler().get_scale() < self.scale_before

        def on_log(self, args, state, control, **kwargs):
            entry = state.log_history[-1]
            if self._scaler() is None or "loss" not in entry:
                return
            earlier = [
                e["repro_num_skipped_updates"] for e in state.log_history[:-1] if "repro_num_skipped_updates" in e
            ]
            if "loss_scale" not in entry:
                entry["repro_loss_scale"] = self._scaler().get_scale()
            entry["repro_num_skipped_updates"] = (earlier[-1] if earlier else 0) + int(self.skipped)

    return LossScaleProbe()


def _inject_overflow(trainer, steps: list[int]) -> None:
    """Makes the input embedding's gradient inf in the backward pass of the given (1-based) optimizer steps."""
    import torch

    weight = trainer.model.get_input_embeddings().weight

    def hook(grad):
        return torch.full_like(grad, math.inf) if trainer.state.global_step + 1 in steps else grad

    weight.register_hook(hook)


def _run_training(run_dir, options, device, precision, optim, resume_from=None, overflow_steps=(), save=True):
    """Builds the model and Trainer for one run and trains it. Returns the Trainer."""
    import torch

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    torch.manual_seed(SEED)
    config = GPT2Config(
        vocab_size=257,
        n_positions=SEQUENCE_LENGTH,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=INITIALIZER_RANGE,
    )
    model = GPT2LMHeadModel(config)
    on_cpu = device == "cpu"
    args = TrainingArguments(
        run_dir,
        max_steps=options.steps,
        per_device_train_batch_size=BATCH_SIZE,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="cosine",
        optim=optim,
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        use_cpu=on_cpu,
        logging_steps=1,
        save_strategy="steps" if save else "no",
        save_steps=1,
        report_to=[],
        seed=SEED,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model, args, train_dataset=make_dataset(load_prompts()))
    trainer.remove_callback(PrinterCallback)
    if on_cpu and precision == "fp16":
        trainer.accelerator.native_amp = True
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
    trainer.add_callback(_make_probe_callback(trainer))
    if overflow_steps:
        _inject_overflow(trainer, list(overflow_steps))
    trainer.train(resume_from_checkpoint=resume_from)
    trainer.save_state()
    return trainer


def _run(name, run_dir, capture, variant, **kwargs):
    """Runs `_run_training`, capturing crashes and messages. Returns the run's record."""
    print(f"[{variant}] {name}: running ...", flush=True)
    capture.reset()
    start = time.perf_counter()
    record = {"dir": run_dir, "status": "ok", "error": None}
    try:
        _run_training(run_dir, **kwargs)
    except Exception as error:
        record["status"] = "crashed"
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=-3)
    record["seconds"] = round(time.perf_counter() - start, 2)
    record["messages"] = list(dict.fromkeys(capture.messages))
    record["other_warnings"] = list(dict.fromkeys(capture.other_warnings))
    outcome = "done" if record["status"] == "ok" else f"CRASHED ({record['error']})"
    print(f"[{variant}] {name}: {outcome} in {record['seconds']} s", flush=True)
    return record


def _copy_checkpoint(source_run: str, step: int, run_dir: str) -> str:
    """Copies `checkpoint-<step>` of `source_run` into a fresh `run_dir`, as if the later ones had been deleted."""
    shutil.rmtree(run_dir, ignore_errors=True)
    checkpoint = os.path.join(run_dir, f"checkpoint-{step}")
    shutil.copytree(os.path.join(source_run, f"checkpoint-{step}"), checkpoint)
    return checkpoint


def run_worker(variant: str, options) -> dict:
    """Runs the chosen scenarios with the `transformers` this process imports. Writes and returns the results."""
    import torch

    import transformers

    torch.set_num_threads(1)  # stock and fork workers run in parallel
    transformers.utils.logging.set_verbosity_info()
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.disable_progress_bar()
    capture = _MessageCapture()
    logging.getLogger("transformers").addHandler(capture)

    device = options.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    base = os.path.join(options.out, variant)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    results = {
        "variant": variant,
        "transformers_file": transformers.__file__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "device": device,
        "runs": {},
    }
    common = {"options": options, "device": device, "capture": capture, "variant": variant}
    runs = _RecordedRuns(os.path.join(base, "worker.json"), results)
    if any(scenario in RESUME_SCENARIOS for scenario in options.scenarios):
        baseline = os.path.join(base, "uninterrupted")
        runs["uninterrupted"] = _run("uninterrupted", baseline, precision="fp16", optim="adamw_torch_fused", **common)
        for scenario in RESUME_SCENARIOS:
            if scenario not in options.scenarios or runs["uninterrupted"]["status"] != "ok":
                continue
            run_dir = os.path.join(base, scenario)
            checkpoint = _copy_checkpoint(baseline, options.resume_step, run_dir)
            if scenario == "no_scaler_pt":
                os.remove(os.path.join(checkpoint, "scaler.pt"))
            precision = "bf16" if scenario == "bf16_resume" else "fp16"
            runs[scenario] = _run(
                scenario, run_dir, precision=precision, optim="adamw_torch_fused", resume_from=checkpoint, **common
            )
    if "fused_skip" in options.scenarios:
        for optim in ("adamw_torch", "adamw_torch_fused"):
            name = f"fused_skip/{optim}"
            run_dir = os.path.join(base, name)
            runs[name] = _run(
                name,
                run_dir,
                precision="fp16",
                optim=optim,
                overflow_steps=options.overflow_steps,
                save=False,
                **common,
            )
    if any(scenario in DDP_SCENARIOS for scenario in options.scenarios):
        try:
            ddp_runs = _launch_ddp_runs(variant, options, base)
        except Exception as error:  # e.g. torchrun cannot be started: that scenario's verdict, not the worker's end
            ddp_runs = {"ddp/uninterrupted": _failed_run(f"the two-process run could not start ({error})")}
        for name, record in ddp_runs.items():
            runs[name] = record
    return results


class _RecordedRuns(dict):
    """
    The worker's run records: every new record is written at once to `path` (with the worker's other `results`), so
    that a worker that dies later still leaves the runs it finished, and the driver knows which ones it lost.
    """

    def __init__(self, path: str, results: dict):
        super().__init__()
        self.path, self.results = path, results
        results["runs"] = self
        self._write()

    def __setitem__(self, name, record):
        super().__setitem__(name, record)
        self._write()

    def _write(self):
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(self.results, f, indent=2)
        os.replace(partial, self.path)


def _failed_run(error: str) -> dict:
    """The record of a run lost with its process (a worker or a torchrun launch that failed): no directory."""
    return {"dir": None, "status": "crashed", "error": error, "process_failed": True}


def _ddp_command(variant: str, options, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={port}",
        "--max_restarts=0",
        *_worker_command(variant, options, worker_flag="--ddp-worker")[1:],
    ]


def _launch_ddp_runs(variant: str, options, base: str) -> dict:
    """
    Runs the DDP scenarios in two processes started with torchrun (`--ddp-worker`), with the `transformers` this
    worker imports. Returns their run records. On timeout, torchrun is stopped, and it stops its processes. When the
    launch fails (a process crashed or exited with an error, or the timeout), the records say why: torchrun's root
    cause (the failing rank, its exit code or signal) and the last error line of the output.
    """
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = _ddp_command(variant, options, port)
    print(f"[{variant}] ddp: running 2 processes ...", flush=True)
    ddp_dir = os.path.join(base, "ddp")
    shutil.rmtree(ddp_dir, ignore_errors=True)  # no results of an earlier launch can pass for this one's
    # torchrun never removes its log folders (`torchelastic_*`): they go to a temporary folder removed afterwards.
    tmp_dir = tempfile.mkdtemp(prefix="repro_ddp_")
    try:
        launcher = subprocess.Popen(
            command,
            env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=tmp_dir),
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        output = _OutputTail(launcher.stdout, sys.stdout)
        try:
            returncode = launcher.wait(timeout=DDP_TIMEOUT)
        except subprocess.TimeoutExpired:
            launcher.terminate()
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, 9)
                launcher.wait()
            returncode = f"timeout after {DDP_TIMEOUT} s"
        output.join(timeout=30)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    path = os.path.join(ddp_dir, "ddp.json")
    if returncode != 0 or not os.path.isfile(path):
        why = [f"torchrun exit status {returncode}" if isinstance(returncode, int) else str(returncode)]
        root_cause, last_error = torchrun_root_cause(output.lines), last_error_line(output.lines)
        why += [f"root cause: {root_cause}"] * bool(root_cause) + [f"last error: {last_error}"] * bool(last_error)
        if returncode == 0:
            why.append(f"no {path}")
        elif os.path.isfile(path):
            why.append("the results had been written")
        return {"ddp/uninterrupted": _failed_run(f"the two-process run failed ({'; '.join(why)})")}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class _OutputTail:
    """Copies a child's output (a text stream) line by line to `sink` as it comes, keeping the last `size` lines."""

    def __init__(self, stream, sink, size: int = 300):
        self.lines = collections.deque(maxlen=size)
        self._thread = threading.Thread(target=self._copy, args=(stream, sink), name="repro-output", daemon=True)
        self._thread.start()

    def _copy(self, stream, sink):
        with stream:
            for line in stream:
                self.lines.append(line.rstrip("\n"))
                sink.write(line)
                sink.flush()

    def join(self, timeout: float | None = None):
        self._thread.join(timeout)


def signal_name(returncode) -> str | None:
    """`SIGABRT` for a return code of -6 (a process ended by a signal), else None."""
    if isinstance(returncode, int) and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return None


def torchrun_root_cause(lines) -> str | None:
    """
    Reads the "Root Cause (first observed failure)" block that torchrun prints when a process fails. Returns e.g.
    `rank 1 exited with -6 (SIGABRT)`, or None when there is no such block.
    """
    lines = list(lines)
    for index, line in enumerate(lines):
        if line.strip().startswith("Root Cause"):
            fields = {}
            for field_line in lines[index + 1 :]:
                if field_line.startswith("====="):
                    break
                match = re.match(r"\s+(\w+)\s*:\s*(.*)", field_line)
                if match:
                    fields.setdefault(match.group(1), match.group(2).strip())
            rank = re.match(r"\d+", fields.get("rank", ""))
            code = re.match(r"-?\d+", fields.get("exitcode", ""))
            if rank is None or code is None:
                return None
            name = signal_name(int(code.group()))
            return f"rank {rank.group()} exited with {code.group()}" + (f" ({name})" if name else "")
    return None


# A line of a process's output that reports its error: a Python exception (`ValueError: ...`, also behind torch's
# `[rank1]: ` prefix), a C++ abort (`terminate called ...`), a fatal signal.
_ERROR_LINE = re.compile(
    r"^(\[rank\d+\]:\s*)?([\w.]*(Error|Exception|Interrupt)\b|terminate called|Fatal Python error|Segmentation fault"
    r"|Aborted|Killed)"
)


def last_error_line(lines) -> str | None:
    """
    The last line of a launch's output that reports an error, leaving out what torchrun itself prints about the
    failure (its log lines and its own `ChildFailedError` traceback). None when there is none.
    """
    lines = list(lines)
    for index in range(len(lines) - 1, -1, -1):  # drop the launcher's own traceback
        if lines[index].startswith("Traceback (most recent call last):") and any(
            "ChildFailedError" in line for line in lines[index:]
        ):
            lines = lines[:index]
            break
    for line in reversed(lines):
        text = line.strip()
        if "torch/distributed/elastic/" in text or "ChildFailedError" in text:
            continue
        if _ERROR_LINE.match(text):
            return _shorten(text, 200)
    return None


def _flat_weights(model):
    import torch

    return torch.cat([tensor.detach().reshape(-1).float() for tensor in model.state_dict().values()])


def run_ddp_worker(variant: str, options) -> None:
    """
    Runs in each of the two torchrun processes: the uninterrupted run and the exact resume. The first process writes
    the records to `<out>/<variant>/ddp/ddp.json`; each record says whether the two processes ended with the same model.
    """
    import torch
    import torch.distributed as dist

    import transformers

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_info()
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.disable_progress_bar()
    capture = _MessageCapture()
    logging.getLogger("transformers").addHandler(capture)
    _import_before_process_group()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    base = os.path.join(options.out, variant, "ddp")
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
    dist.barrier()
    common = {"options": options, "device": "cpu", "precision": "fp16", "optim": "adamw_torch_fused"}
    baseline = os.path.join(base, "uninterrupted")

    def run(name, run_dir, resume_from=None):
        capture.reset()
        start = time.perf_counter()
        record = {"dir": run_dir, "status": "ok", "error": None}
        trainer = None
        try:
            trainer = _run_training(run_dir, resume_from=resume_from, **common)
        except Exception as error:
            record["status"] = "crashed"
            record["error"] = f"{type(error).__name__}: {error}"
        record["seconds"] = round(time.perf_counter() - start, 2)
        record["messages"] = list(dict.fromkeys(capture.messages))
        record["other_warnings"] = list(dict.fromkeys(capture.other_warnings))
        if trainer is not None:
            weights = _flat_weights(trainer.model)
            gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, weights)
            record["processes_hold_the_same_model"] = all(torch.equal(gathered[0], other) for other in gathered)
        if rank == 0:
            outcome = "done" if record["status"] == "ok" else f"CRASHED ({record['error']})"
            print(f"[{variant}] {name}: {outcome} in {record['seconds']} s", flush=True)
        dist.barrier()
        return record

    runs = {"ddp/uninterrupted": run("ddp/uninterrupted", baseline)}
    if runs["ddp/uninterrupted"]["status"] == "ok":
        step = options.resume_step
        if "ddp_exact_resume" in options.scenarios:
            run_dir = os.path.join(base, "exact_resume")
            if rank == 0:
                _copy_checkpoint(baseline, step, run_dir)
            dist.barrier()
            runs["ddp/exact_resume"] = run(
                "ddp/exact_resume", run_dir, resume_from=os.path.join(run_dir, f"checkpoint-{step}")
            )
    if rank == 0:
        with open(os.path.join(base, "ddp.json"), "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=2)
    # The Trainers are garbage in reference cycles (callbacks, accelerator, model), and their DDP models' reducers
    # hold the process group: collect them first, so that destroying the group frees it, and its gloo threads stop
    # now rather than at interpreter exit (see `_import_before_process_group`).
    gc.collect()
    dist.destroy_process_group()
    left = [name for name in _thread_names() if "gloo" in name]
    if left:
        print(
            f"[{variant}] rank {rank}: warning: gloo threads still running after destroy_process_group ({', '.join(left)}):"
            " something still holds the process group, and its destruction at interpreter exit can abort this "
            "process (std::terminate); see _import_before_process_group in utils/repro.py",
            file=sys.stderr,
            flush=True,
        )


def _import_before_process_group() -> None:
    """
    Imports, before `init_process_group`, the modules a run imports, so that none captures the process group.

    `torch.distributed.nn.functional` (imported by transformers' model and Trainer modules through
    `torch.distributed.fsdp` and `torch.distributed._shard`) declares its collectives with `group=group.WORLD`
    defaults, evaluated on import: imported while a default group exists, those defaults hold that group for good, so
    `destroy_process_group()` unregisters it but cannot free it, and the group with its gloo threads (two
    `pt_gloo_runloop`, one `gloo_tcp_loop`) lived on into interpreter finalization: the known class of exit aborts
    (pytorch#179291) behind issue 23, where a process that had done and written its work died there (`terminate
    called without an active exception`, SIGABRT) and torchrun failed the launch. Imported before the group exists,
    the defaults are None (the default group at call time).
    """
    import torch.distributed.nn  # noqa: F401

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: F401
    from transformers.trainer_callback import PrinterCallback  # noqa: F401


def _thread_names() -> list[str]:
    """The names of this process's OS threads (Linux: /proc/self/task/*/comm), to see gloo's; [] elsewhere."""
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(names)


# ---------------------------------------------------------------------------------------------------------------------
# Driver: starts the workers, compares their runs, prints tables and verdicts, writes report.json and repro.png.


def fail(message: str):
    """Exits with status 2 (usage or setup error), printing `message` without a traceback."""
    print(f"repro: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def ensure_stock_src(stock_src: str) -> None:
    """Extracts the pristine sources (tag `upstream-base` of each fork) into `stock_src` when missing."""
    forks = {"transformers": FORK_DIR}
    if os.path.isdir(os.path.join(ACCELERATE_FORK_DIR, ".git")):
        forks["accelerate"] = ACCELERATE_FORK_DIR
    if all(os.path.isfile(os.path.join(stock_src, name, "__init__.py")) for name in forks):
        return
    if os.path.normpath(stock_src) != os.path.normpath(os.path.join(REPO_ROOT, DEFAULT_STOCK_SRC)):
        fail(f"--stock-src {stock_src} needs {' and '.join(f'{name}/__init__.py' for name in forks)}")
    print(f"extracting stock {' and '.join(forks)} ({STOCK_TAG} of the forks) into {stock_src} ...", flush=True)
    target = os.path.dirname(stock_src)
    partial = target + ".partial"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        for fork in forks.values():
            archive = subprocess.run(["git", "-C", fork, "archive", STOCK_TAG, "src"], capture_output=True)
            if archive.returncode != 0:
                fail(f"cannot extract {STOCK_TAG} from {fork}: {archive.stderr.decode(errors='replace').strip()}")
            untar = subprocess.run(["tar", "-x", "-C", partial], input=archive.stdout, capture_output=True)
            if untar.returncode != 0:
                fail(f"cannot unpack {STOCK_TAG} into {partial}: {untar.stderr.decode(errors='replace').strip()}")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(partial, target)
    except OSError as error:
        fail(f"cannot extract {STOCK_TAG} from {FORK_DIR} into {target}: {error}")


def _worker_command(variant: str, options, worker_flag: str = "--worker") -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        worker_flag,
        variant,
        "--out",
        options.out,
        "--steps",
        str(options.steps),
        "--resume-step",
        str(options.resume_step),
        "--device",
        options.device,
        "--scenarios",
        *options.scenarios,
        "--overflow-steps",
        ",".join(map(str, options.overflow_steps)),
    ]


def _worker_env(variant: str, options) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != options.stock_src]
    if variant == "stock":
        paths.insert(0, options.stock_src)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_workers(options) -> dict:
    """
    Runs one worker process per variant, in parallel. Returns `{variant: worker results}`. A worker that fails (exits
    with an error, is killed, or leaves no readable results) does not stop the others: the runs it did not finish
    become crashed runs saying why (its exit status or signal and its last error line), so that each of its scenarios
    gets that verdict. A worker that imported the wrong `transformers` is a setup error. On any exception (Ctrl-C
    included) the workers are killed: no worker outlives this call.
    """
    processes, outputs = {}, {}
    try:
        for variant in options.variants:
            processes[variant] = subprocess.Popen(
                _worker_command(variant, options),
                env=_worker_env(variant, options),
                cwd=REPO_ROOT,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )
            outputs[variant] = _OutputTail(processes[variant].stderr, sys.stderr)
        results = {}
        for variant, process in processes.items():
            returncode = process.wait()
            outputs[variant].join(timeout=30)
            results[variant] = _read_worker_results(variant, options, returncode, outputs[variant].lines)
            transformers_file = results[variant]["transformers_file"]
            if transformers_file is not None:
                is_stock = os.path.abspath(transformers_file).startswith(options.stock_src + os.sep)
                if (variant == "stock") != is_stock:
                    fail(f"the {variant} worker imported {transformers_file}")
        return results
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
        for output in outputs.values():
            output.join(timeout=30)


def _read_worker_results(variant: str, options, returncode: int, output_lines) -> dict:
    """
    Reads `<out>/<variant>/worker.json` (written by the worker after each run). When the worker failed, every run of
    the chosen scenarios it did not record becomes a crashed run with the reason.
    """
    path = os.path.join(options.out, variant, "worker.json")
    results, unreadable = None, None
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        if not isinstance(results, dict) or not isinstance(results.get("runs"), dict):
            raise ValueError("no 'runs'")
    except FileNotFoundError:
        results = None
    except (OSError, ValueError) as error:
        results, unreadable = None, f"{type(error).__name__}: {error}"
    if returncode == 0 and results is not None:
        return results
    if results is None:
        results = {"variant": variant, "runs": {}}
    for key in ("transformers_file", "transformers_version", "torch_version", "device"):
        results.setdefault(key, None)
    name = signal_name(returncode)
    why = f"the {variant} worker failed (exit status {returncode}{f', {name}' if name else ''})"
    if returncode == 0:
        why = f"the {variant} worker left no readable results"
    if unreadable:
        why += f"; {path} cannot be read ({unreadable})"
    last_error = last_error_line(output_lines)
    if last_error:
        why += f"; last error: {last_error}"
    print(f"repro: {why}", file=sys.stderr, flush=True)
    for scenario in options.scenarios:
        for run_name in SCENARIOS[scenario][1:3]:
            if run_name not in results["runs"]:
                results["runs"][run_name] = _failed_run(why)
    return results


def with_probe_fields(history: list[dict]) -> tuple[list[dict], bool]:
    """
    Returns `history` with repro's observed `repro_*` fields under the names of the logged fields (`loss_scale`,
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
    rows_a, rows_b = resume_diff.step_rows(history_a), resume_diff.step_rows(history_b)
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
        "reference_rows": rows_a,
        "candidate_rows": rows_b,
        "comparison": resume_diff.compare_histories(history_a, history_b),
        "lr_advanced_on_skipped_updates": resume_diff.lr_advanced_on_skipped_updates(rows_b),
        "skipped_steps": [step for step in rows_b if resume_diff.was_skipped(rows_b, step)],
        "processes_hold_the_same_model": candidate.get("processes_hold_the_same_model") if candidate else None,
    }
    result["verdict"] = verdict(scenario, result)
    result["behaves_as_fixed"] = fork_behaves_as_fixed(scenario, result)
    return result


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
                f"LR advances on {len(advanced)} of {len(skipped)} skipped updates (steps {_steps(advanced)})"
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
        parts.append(
            f"says: {_shorten(_without_dirs(messages[0]))}" if messages else "says nothing about the loss scale"
        )
    return "; ".join(parts)


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps))


def _without_dirs(text: str) -> str:
    """Shortens the absolute paths in a message to their last components: `.../checkpoint-11/scaler.pt`."""
    return re.sub(r"/\S*/(checkpoint-\d+)", r".../\1", text)


def _shorten(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


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
        title = SCENARIOS[scenario][0].format(r=options.resume_step, o=_steps(options.overflow_steps))
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
            "lr_scheduler_type": "cosine",
            "initializer_range": INITIALIZER_RANGE,
            "stock_src": options.stock_src,
        },
        "variants": {
            variant: {key: worker.get(key) for key in ("transformers_file", "transformers_version", "torch_version")}
            for variant, worker in workers.items()
        },
        "scenarios": scenarios,
        "fork_as_expected": all(result["behaves_as_fixed"] for result in fork_results) if fork_results else None,
    }


def print_report(report: dict, options) -> None:
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
            for message in result["messages"]:
                print(f"  {_shorten(message, 200)}")
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = report["scenarios"]
    # Constrained layout places the figure title above the subplots' titles (tight_layout let them overlap).
    fig, axes = plt.subplots(
        len(scenarios), 3, figsize=(15, 3.6 * len(scenarios)), squeeze=False, layout="constrained"
    )
    colors = {"stock": "tab:red", "fork": "tab:blue"}
    markers = {"stock": "x", "fork": "o"}  # distinct, so that overlapping curves stay visible
    for axes_row, (scenario, entry) in zip(axes, scenarios.items()):
        labels = SCENARIOS[scenario][3]
        crashed = [variant for variant, result in entry["variants"].items() if result["status"] == "crashed"]
        for column, (ax, field) in enumerate(zip(axes_row, ("learning_rate", "loss", "loss_scale"))):
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
            if field == "loss_scale":
                ax.set_yscale("log", base=2)
            title = f"{scenario}: {field}"
            if crashed:
                lost = [v for v in crashed if not entry["variants"][v]["reference_rows"]]
                what = "no curves" if len(lost) == len(crashed) else "no resumed curve"
                title += f" ({', '.join(crashed)}: crashed, {what})"
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
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Reproduce transformers#34053 (fp16 resume) offline against stock transformers and the fork."
    )
    parser.add_argument(
        "--out", default=os.path.join("build", "repro"), help="output directory (default: build/repro)"
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    parser.add_argument("--resume-step", type=int, default=11, help="checkpoint to resume from (default: 11)")
    parser.add_argument(
        "--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS), help="default: all"
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda if present")
    parser.add_argument("--stock-src", default=DEFAULT_STOCK_SRC, help=f"stock sources (default: {DEFAULT_STOCK_SRC})")
    parser.add_argument("--variants", default="stock,fork", help="comma-separated, default: stock,fork")
    parser.add_argument(
        "--overflow-steps",
        help="comma-separated steps (1..--steps) with forced overflow in fused_skip (default: the two middle steps, "
        "9,10 for 20 steps)",
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-worker", choices=VARIANTS, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    options.out = os.path.abspath(options.out)
    options.stock_src = os.path.abspath(options.stock_src)
    options.scenarios = list(dict.fromkeys(options.scenarios))
    options.variants = list(dict.fromkeys(v.strip() for v in options.variants.split(",") if v.strip()))
    if not options.variants or any(v not in VARIANTS for v in options.variants):
        parser.error(f"--variants: choose among {', '.join(VARIANTS)}")
    if options.steps < 2:
        parser.error(f"--steps must be at least 2 (a checkpoint to resume from, then more steps), got {options.steps}")
    if not 1 <= options.resume_step < options.steps:
        parser.error("--resume-step must be at least 1 and less than --steps")
    if options.overflow_steps is None:
        options.overflow_steps = sorted({max(1, options.steps // 2 - 1), options.steps // 2})
    else:
        try:
            overflow_steps = sorted({int(s) for s in options.overflow_steps.split(",") if s.strip()})
        except ValueError:
            parser.error(f"--overflow-steps: comma-separated step numbers expected, got {options.overflow_steps!r}")
        outside = [s for s in overflow_steps if not 1 <= s <= options.steps]
        if not overflow_steps or outside:
            parser.error(
                f"--overflow-steps: steps between 1 and --steps ({options.steps}) expected, got "
                f"{options.overflow_steps!r}"
            )
        options.overflow_steps = overflow_steps
    return options


def main(argv=None) -> int:
    options = parse_args(argv)
    if options.worker:
        run_worker(options.worker, options)
        return 0
    if options.ddp_worker:
        run_ddp_worker(options.ddp_worker, options)
        return 0
    start = time.perf_counter()
    if "stock" in options.variants:
        ensure_stock_src(options.stock_src)
    try:
        os.makedirs(options.out, exist_ok=True)
    except OSError as error:
        fail(f"--out {options.out}: cannot create the output directory ({error})")
    print(
        f"repro #34053: {options.steps} steps, resume from checkpoint-{options.resume_step}, scenarios "
        f"{', '.join(options.scenarios)}; variants {', '.join(options.variants)} (one process each) ...",
        flush=True,
    )
    workers = run_workers(options)
    report = build_report(options, workers)
    print_report(report, options)
    report_path, plot_path = os.path.join(options.out, "report.json"), os.path.join(options.out, "repro.png")
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(resume_diff.json_safe(report), f, indent=2)
    plot_report(report, options, plot_path)
    print(f"\nreport: {report_path}\nplot:   {plot_path}")
    runs = f"{options.out}/fork/uninterrupted {options.out}/fork/no_scaler_pt"
    print(f"compare any two runs: python utils/resume_diff.py {runs}")
    fork_ok = report["fork_as_expected"]
    if fork_ok is not None:
        print(f"fork behaves as fixed in every scenario: {'yes' if fork_ok else 'NO'}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0 if fork_ok in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
