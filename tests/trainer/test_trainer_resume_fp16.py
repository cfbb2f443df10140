# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""
Exact resume of fp16 mixed precision training (#34053).

On CPU, Accelerate builds no `GradScaler` and `fp16=True` silently trains in fp32, so these tests put a
`torch.amp.GradScaler("cpu")` on the Trainer's accelerator and turn on autocast: the forward really runs in fp16 and the
loss scale really moves. On an accelerator the same tests run in real fp16, with a `GradScaler` for that device set up
the same way (a low initial scale and a short growth interval, so that a few steps exercise backoff and growth).
"""

import os
from unittest import mock

import torch
from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.testing_isolation import run_test_in_fresh_process
from transformers.testing_utils import TestCasePlus, require_torch_accelerator, torch_device
from transformers.trainer_skipped_updates import get_num_skipped_updates


# Overflows are injected at these update steps: a streak of three skipped updates. With `growth_interval=3` the scale
# grows at steps 3 and 9, so checkpoint-5 sits inside the streak, checkpoint-8 just before a growth, and checkpoint-9
# just after one.
OVERFLOW_STEPS = (4, 5, 6)
MAX_STEPS = 12
RESUME_STEPS = {"inside_overflow_streak": 5, "before_scale_growth": 8, "after_scale_growth": 9}
LOGGED_FIELDS = ("loss", "grad_norm", "learning_rate", "loss_scale", "num_skipped_updates")


class RandomTokenDataset(torch.utils.data.Dataset):
    def __init__(self, length=64, seq_length=16, vocab_size=64):
        generator = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(0, vocab_size, (length, seq_length), generator=generator)

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.input_ids[i]}


class GradientOverflowCallback(TrainerCallback):
    """Turns one gradient entry into `inf` during the update steps in `steps`, in every micro-batch of those steps."""

    def __init__(self, steps):
        self.steps = set(steps)
        self.active = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.get_input_embeddings().weight.register_hook(self._overflow)

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 in self.steps

    def _overflow(self, grad):
        if not self.active:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad


class SaveAtSteps(TrainerCallback):
    """Saves a checkpoint at the given update steps only (saving is most of the cost of these tiny runs)."""

    def __init__(self, steps):
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step in self.steps


def get_fp16_trainer(output_dir, optim="adamw_torch", gradient_accumulation_steps=1, precision="fp16", **kwargs):
    """
    A tiny GPT-2 Trainer that saves every step, or only at the steps in `checkpoint_steps` if given. `precision` is
    "fp16" (with a real loss scaler), "bf16" or "fp32".
    """
    overflow_steps = kwargs.pop("overflow_steps", OVERFLOW_STEPS)
    callbacks = [GradientOverflowCallback(overflow_steps)]
    checkpoint_steps = kwargs.pop("checkpoint_steps", None)
    if checkpoint_steps is not None:
        kwargs["save_strategy"] = "no"
        callbacks.append(SaveAtSteps(checkpoint_steps))
    max_steps = kwargs.pop("max_steps", MAX_STEPS)
    scaler_kwargs = {"init_scale": 2.0**10, "growth_interval": 3, **kwargs.pop("scaler_kwargs", {})}
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=gradient_accumulation_steps,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        optim=optim,
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        use_cpu=torch_device in (None, "cpu"),
        save_steps=1,
        logging_steps=1,
        seed=42,
        report_to=[],
        disable_tqdm=True,
        **kwargs,
    )
    trainer = Trainer(model, args, train_dataset=RandomTokenDataset(), callbacks=callbacks)
    if precision == "fp16":
        trainer.accelerator.scaler = torch.amp.GradScaler(args.device.type, **scaler_kwargs)
        if args.device.type == "cpu":
            trainer.accelerator.native_amp = True
    return trainer


def training_logs(trainer):
    return {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}


def assert_exactly_equal(actual, expected, path="state"):
    """Bit-exact comparison of nested dicts, lists, tensors and numbers."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype, f"{path}: {actual!r}"
        assert torch.equal(actual, expected), f"{path} differs"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{path}: keys {actual.keys()}"
        for key in expected:
            assert_exactly_equal(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: {len(actual)} != {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_exactly_equal(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_same_training(resumed, uninterrupted):
    """The resumed run matches the uninterrupted one at every logged step and in its final states, bit for bit."""
    resumed_logs, uninterrupted_logs = training_logs(resumed), training_logs(uninterrupted)
    assert resumed_logs.keys() == uninterrupted_logs.keys()
    for step, expected in uninterrupted_logs.items():
        actual = {field: resumed_logs[step].get(field) for field in LOGGED_FIELDS}
        assert actual == {field: expected.get(field) for field in LOGGED_FIELDS}, f"step {step} differs"
    assert resumed.state.global_step == uninterrupted.state.global_step
    assert get_num_skipped_updates(resumed.state) == get_num_skipped_updates(uninterrupted.state)
    assert_exactly_equal(resumed.model.state_dict(), uninterrupted.model.state_dict(), "model")
    assert_exactly_equal(resumed.optimizer.state_dict(), uninterrupted.optimizer.state_dict(), "optimizer")
    assert_exactly_equal(resumed.lr_scheduler.state_dict(), uninterrupted.lr_scheduler.state_dict(), "scheduler")
    assert_exactly_equal(resumed.accelerator.scaler.state_dict(), uninterrupted.accelerator.scaler.state_dict())


class TrainerResumeFp16ParityTest(TestCasePlus):
    # One uninterrupted run per optimizer and accumulation, against which every resume point is checked (a subtest
    # each): the resumed runs are the only ones that differ between resume points.
    @parameterized.expand(
        [(optim, accumulation) for optim in ("adamw_torch", "adamw_torch_fused", "sgd") for accumulation in (1, 2)]
    )
    @run_test_in_fresh_process(num_threads=1)
    def test_resume_matches_uninterrupted_run(self, optim, gradient_accumulation_steps):
        output_dir = self.get_auto_remove_tmp_dir()
        uninterrupted = get_fp16_trainer(
            output_dir, optim, gradient_accumulation_steps, checkpoint_steps=RESUME_STEPS.values()
        )
        uninterrupted.train()
        # The scenario really exercises the loss scale: the injected overflows were skipped and the scale grew.
        self.assertEqual(get_num_skipped_updates(uninterrupted.state), len(OVERFLOW_STEPS))
        scales = [entry["loss_scale"] for entry in training_logs(uninterrupted).values()]
        self.assertGreater(max(scales), scales[0])

        for resume_point, step in RESUME_STEPS.items():
            with self.subTest(resume_point=resume_point):
                resumed = get_fp16_trainer(
                    self.get_auto_remove_tmp_dir(), optim, gradient_accumulation_steps, checkpoint_steps=()
                )
                resumed.train(resume_from_checkpoint=os.path.join(output_dir, f"checkpoint-{step}"))
                assert_same_training(resumed, uninterrupted)

    @run_test_in_fresh_process(num_threads=1)
    def test_parity_check_fails_without_scaler_restore(self):
        # Sensitivity: with the scaler restore removed, the same comparison catches the divergence of #34053.
        output_dir = self.get_auto_remove_tmp_dir()
        uninterrupted = get_fp16_trainer(output_dir, checkpoint_steps=[8])
        uninterrupted.train()
        resumed = get_fp16_trainer(self.get_auto_remove_tmp_dir(), checkpoint_steps=())
        with mock.patch("transformers.trainer.load_scaler_state"):
            resumed.train(resume_from_checkpoint=os.path.join(output_dir, "checkpoint-8"))
        with self.assertRaisesRegex(AssertionError, "step 9 differs"):
            assert_same_training(resumed, uninterrupted)

    @require_torch_accelerator
    @run_test_in_fresh_process
    def test_resume_matches_uninterrupted_run_on_accelerator(self):
        # Real fp16 with the scaler Accelerate builds for the device.
        output_dir = self.get_auto_remove_tmp_dir()
        uninterrupted = get_fp16_trainer(output_dir, "adamw_torch_fused")
        uninterrupted.train()
        resumed = get_fp16_trainer(self.get_auto_remove_tmp_dir(), "adamw_torch_fused")
        resumed.train(resume_from_checkpoint=os.path.join(output_dir, "checkpoint-5"))
        assert_same_training(resumed, uninterrupted)
