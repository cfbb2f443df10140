"""
Training runs in this process, with the `transformers` it imports: the Trainer of one run, the probe callback that
observes the loss scale and the skipped updates, the forced overflows, the run's record (crash and messages), and the
body of each of the two torchrun processes (`--ddp-worker`).
"""

import gc
import json
import logging
import math
import os
import re
import shutil
import sys
import time
import traceback

from .scenarios import (
    BATCH_SIZE,
    INITIALIZER_RANGE,
    LEARNING_RATE,
    LR_SCHEDULER,
    OPTIM,
    SEED,
    SEQUENCE_LENGTH,
    load_prompts,
    make_dataset,
)


PROBE_FIELDS = {"repro_grad_scale": "grad_scale", "repro_num_skipped_updates": "num_skipped_updates"}
# Messages about loss scaling (whole words: run directories such as `no_scaler_pt` must not match).
LOSS_SCALE_MESSAGE = re.compile(r"\bloss scale\b|\bscaler\b|GradScaler", re.IGNORECASE)


class MessageCapture(logging.Handler):
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


def start_worker_process() -> MessageCapture:
    """
    Sets this worker process up: one torch thread (the workers run in parallel), transformers' messages from info level
    captured rather than printed, no progress bars. Returns the capture.
    """
    import torch

    import transformers

    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_info()
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.disable_progress_bar()
    capture = MessageCapture()
    logging.getLogger("transformers").addHandler(capture)
    return capture


def _make_probe_callback(trainer):
    """
    Returns a callback that adds `repro_num_skipped_updates` to the log entries of an fp16 run, and `repro_grad_scale`
    to those of a run that does not log `grad_scale` itself (stock). An update counts as skipped when the scale backed
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
            if "grad_scale" not in entry:
                entry["repro_grad_scale"] = self._scaler().get_scale()
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
        lr_scheduler_type=LR_SCHEDULER,
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


def _train_and_record(run_dir, capture, **kwargs):
    """Runs `_run_training`, capturing a crash and the messages. Returns the run's record and its Trainer (or None)."""
    capture.reset()
    start = time.perf_counter()
    record = {"dir": run_dir, "status": "ok", "error": None}
    trainer = None
    try:
        trainer = _run_training(run_dir, **kwargs)
    except Exception as error:
        record["status"] = "crashed"
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=-3)
    record["seconds"] = round(time.perf_counter() - start, 2)
    record["messages"] = list(dict.fromkeys(capture.messages))
    record["other_warnings"] = list(dict.fromkeys(capture.other_warnings))
    return record, trainer


def _say_how_it_ended(variant: str, name: str, record: dict) -> None:
    outcome = "done" if record["status"] == "ok" else f"CRASHED ({record['error']})"
    print(f"[{variant}] {name}: {outcome} in {record['seconds']} s", flush=True)


def run_one(name, run_dir, capture, variant, **kwargs) -> dict:
    """Trains one run of a worker, saying when it starts and how it ended. Returns the run's record."""
    print(f"[{variant}] {name}: running ...", flush=True)
    record, _ = _train_and_record(run_dir, capture, **kwargs)
    _say_how_it_ended(variant, name, record)
    return record


def copy_checkpoint(source_run: str, step: int, run_dir: str) -> str:
    """Copies `checkpoint-<step>` of `source_run` into a fresh `run_dir`, as if the later ones had been deleted."""
    shutil.rmtree(run_dir, ignore_errors=True)
    checkpoint = os.path.join(run_dir, f"checkpoint-{step}")
    shutil.copytree(os.path.join(source_run, f"checkpoint-{step}"), checkpoint)
    return checkpoint


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

    capture = start_worker_process()
    import_before_process_group()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    base = os.path.join(options.out, variant, "ddp")
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
    dist.barrier()
    common = {"options": options, "device": "cpu", "precision": "fp16", "optim": OPTIM}
    baseline = os.path.join(base, "uninterrupted")

    def run(name, run_dir, resume_from=None):
        record, trainer = _train_and_record(run_dir, capture, resume_from=resume_from, **common)
        if trainer is not None:
            weights = _flat_weights(trainer.model)
            gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, weights)
            record["processes_hold_the_same_model"] = all(torch.equal(gathered[0], other) for other in gathered)
        if rank == 0:
            _say_how_it_ended(variant, name, record)
        dist.barrier()
        return record

    runs = {"ddp/uninterrupted": run("ddp/uninterrupted", baseline)}
    if runs["ddp/uninterrupted"]["status"] == "ok":
        step = options.resume_step
        if "ddp_exact_resume" in options.scenarios:
            run_dir = os.path.join(base, "exact_resume")
            if rank == 0:
                copy_checkpoint(baseline, step, run_dir)
            dist.barrier()
            runs["ddp/exact_resume"] = run(
                "ddp/exact_resume", run_dir, resume_from=os.path.join(run_dir, f"checkpoint-{step}")
            )
    if rank == 0:
        with open(os.path.join(base, "ddp.json"), "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=2)
    # The Trainers are garbage in reference cycles (callbacks, accelerator, model), and their DDP models' reducers
    # hold the process group: collect them first, so that destroying the group frees it, and its gloo threads stop
    # now rather than at interpreter exit (see `import_before_process_group`).
    gc.collect()
    dist.destroy_process_group()
    left = [name for name in thread_names() if "gloo" in name]
    if left:
        print(
            f"[{variant}] rank {rank}: warning: gloo threads still running after destroy_process_group ({', '.join(left)}):"
            " something still holds the process group, and its destruction at interpreter exit can abort this "
            "process (std::terminate); see import_before_process_group in utils/repro/runs.py",
            file=sys.stderr,
            flush=True,
        )


def import_before_process_group() -> None:
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


def thread_names() -> list[str]:
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
