"""Checkpoints stay portable both ways between the patched Trainer and stock transformers (the pinned release), in fp16 and bf16.

Stock runs in a subprocess with `PYTHONPATH=<pristine src>`, extracted from the fork's `upstream-base` tag; the patched
Trainer in a subprocess of the fork's editable install. Each run trains a tiny GPT-2 on CPU, in fp16 with a CPU
`GradScaler` and one injected gradient overflow (so that the loss scale to save and restore is not the initial one), or
in bf16. The patched Trainer adds nothing to `trainer_state.json` but `grad_scale` in its log entries.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
FORK = REPO_ROOT / "build" / "transformers"
OVERFLOW_STEP = 2
SAVE_STEP = 3
MAX_STEPS = 5

WORKER = """
import json, sys
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

output_dir, precision, resume_from = sys.argv[1], sys.argv[2], sys.argv[3] or None
overflow_step, max_steps, save_steps = (int(value) for value in sys.argv[4:7])


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Overflow(TrainerCallback):
    active = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.get_input_embeddings().weight.register_hook(self.hook)

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 == overflow_step

    def hook(self, grad):
        if self.active:
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))
args = TrainingArguments(
    output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=2, learning_rate=1e-3, optim="adamw_torch",
    fp16=precision == "fp16", bf16=precision == "bf16", use_cpu=True, save_steps=save_steps, logging_steps=1,
    report_to=[], disable_tqdm=True, restore_callback_states_from_checkpoint=True,
)
trainer = Trainer(model, args, train_dataset=Data(), callbacks=[Overflow()])
if precision == "fp16":
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer.accelerator.native_amp = True
trainer.train(resume_from_checkpoint=resume_from)
logs = [entry for entry in trainer.state.log_history if "loss" in entry]
print("RESULT " + json.dumps({
    "transformers": transformers.__file__,
    "global_step": trainer.state.global_step,
    "scheduler_steps": trainer.lr_scheduler.last_epoch,
    "grad_scale": [entry.get("grad_scale") for entry in logs],
    "final_scale": trainer.accelerator.scaler.get_scale() if precision == "fp16" else None,
}))
"""


@pytest.fixture(scope="module")
def stock_src(tmp_path_factory):
    """The pristine sources of the pinned release, extracted from the fork's `upstream-base` tag."""
    if subprocess.run(
        ["git", "-C", str(FORK), "rev-parse", "-q", "--verify", "upstream-base"], capture_output=True
    ).returncode:
        pytest.skip(f"needs the fork: {FORK} has no 'upstream-base' tag (run `make fork`)")
    target = tmp_path_factory.mktemp("stock")
    archive = subprocess.run(
        ["git", "-C", str(FORK), "archive", "upstream-base", "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "src"


def train(variant, stock_src, output_dir, precision, resume_from=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    if variant == "stock":
        env["PYTHONPATH"] = str(stock_src)
    command = [sys.executable, "-c", WORKER, str(output_dir), precision, str(resume_from or "")]
    command += [str(OVERFLOW_STEP), str(MAX_STEPS), str(SAVE_STEP)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{variant} {precision} run failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["transformers"].startswith(str(stock_src)) == (variant == "stock"), result["transformers"]
    return result


# The scale after the overflow at step 2 (initial 2**10, halved once, no growth within 5 steps).
SCALE_AFTER_OVERFLOW = 2.0**9


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_patched_checkpoint_resumes_in_stock(tmp_path, stock_src, precision):
    patched = train("patched", stock_src, tmp_path / "patched", precision)
    checkpoint = tmp_path / "patched" / f"checkpoint-{SAVE_STEP}"
    state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    train("stock", stock_src, tmp_path / "stock-ref", precision)
    stock_state = tmp_path / "stock-ref" / f"checkpoint-{SAVE_STEP}" / "trainer_state.json"
    stock_state = json.loads(stock_state.read_text(encoding="utf-8"))
    assert state.keys() == stock_state.keys()  # nothing stock's `TrainerState(**json)` would reject
    resumed = train("stock", stock_src, tmp_path / "stock", precision, resume_from=checkpoint)
    assert resumed["global_step"] == MAX_STEPS
    # Stock logs no loss scale; the history it restored from the checkpoint keeps the patched Trainer's entries.
    assert resumed["grad_scale"] == patched["grad_scale"][:SAVE_STEP] + [None] * (MAX_STEPS - SAVE_STEP)
    if precision == "fp16":
        assert patched["grad_scale"] == [2.0**10] + [SCALE_AFTER_OVERFLOW] * (MAX_STEPS - 1)
        assert resumed["final_scale"] == SCALE_AFTER_OVERFLOW  # stock restored the patched Trainer's scaler.pt
    else:
        assert patched["grad_scale"] == [None] * MAX_STEPS


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_stock_checkpoint_resumes_in_patched(tmp_path, stock_src, precision):
    train("stock", stock_src, tmp_path / "stock", precision)
    checkpoint = tmp_path / "stock" / f"checkpoint-{SAVE_STEP}"
    resumed = train("patched", stock_src, tmp_path / "patched", precision, resume_from=checkpoint)
    assert resumed["global_step"] == MAX_STEPS
    after_resume = resumed["grad_scale"][SAVE_STEP:]
    if precision == "fp16":
        # The patched Trainer restored stock's scaler.pt and logs the scale from the resume on.
        assert after_resume == [SCALE_AFTER_OVERFLOW] * (MAX_STEPS - SAVE_STEP)
    else:
        assert after_resume == [None] * (MAX_STEPS - SAVE_STEP)
