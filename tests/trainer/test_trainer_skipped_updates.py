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
Optimizer updates skipped by fp16 loss scaling: the same decision for every optimizer, the count, the loss scale in the
logs. On CPU, Accelerate builds no `GradScaler`, so the tests put a `torch.amp.GradScaler("cpu")` on the Trainer's
accelerator and turn on autocast: the forward really runs in fp16 and the loss scale really moves.
"""

import json
import os
import unittest
from unittest import mock

import torch
from accelerate import Accelerator
from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainerState, TrainingArguments
from transformers.testing_isolation import run_test_in_fresh_process
from transformers.testing_utils import CaptureLogger, TestCasePlus
from transformers.trainer_skipped_updates import SkippedUpdatesMonitor, get_num_skipped_updates
from transformers.utils import logging


# Overflows are injected at these update steps: a streak of three skipped updates.
OVERFLOW_STEPS = (4, 5, 6)
MAX_STEPS = 12


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


def get_fp16_trainer(output_dir, optim="adamw_torch", gradient_accumulation_steps=1, precision="fp16", **kwargs):
    """
    A tiny GPT-2 Trainer on CPU that saves at step 5 and at the end (the tests resume from checkpoint-5). `precision` is
    "fp16" (with a loss scaler), "bf16" or "fp32".
    """
    overflow_steps = kwargs.pop("overflow_steps", OVERFLOW_STEPS)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=kwargs.pop("max_steps", MAX_STEPS),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=gradient_accumulation_steps,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        optim=optim,
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        use_cpu=True,
        save_steps=5,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        **kwargs,
    )
    trainer = Trainer(
        model, args, train_dataset=RandomTokenDataset(), callbacks=[GradientOverflowCallback(overflow_steps)]
    )
    if precision == "fp16":
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
        trainer.accelerator.native_amp = True
    return trainer


def training_logs(trainer):
    return {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}


def accelerate_reports_skips_of_amp_aware_optimizers():
    """Whether the installed Accelerate sees the update that a fused optimizer skipped (huggingface/accelerate#4242)."""
    model = torch.nn.Linear(2, 2)
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu")
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), fused=True))
    accelerator.backward(model(torch.ones(1, 2)).sum())
    model.weight.grad[0, 0] = float("inf")
    optimizer.step()
    return optimizer.step_was_skipped


class TrainerSkippedUpdatesTest(TestCasePlus):
    @parameterized.expand([(1,), (2,)])
    @run_test_in_fresh_process(num_threads=1)
    def test_fused_and_unfused_optimizers_skip_the_same_updates(self, gradient_accumulation_steps):
        self.assert_fused_and_unfused_optimizers_skip_the_same_updates(gradient_accumulation_steps)

    @run_test_in_fresh_process(num_threads=1)
    def test_accelerate_with_the_fix_needs_no_fallback(self):
        if not accelerate_reports_skips_of_amp_aware_optimizers():
            self.skipTest(reason="Accelerate does not report the updates skipped by AMP-aware optimizers")
        with mock.patch("transformers.trainer_skipped_updates.is_accelerate_available", return_value=True):
            self.assert_fused_and_unfused_optimizers_skip_the_same_updates(gradient_accumulation_steps=1)

    def assert_fused_and_unfused_optimizers_skip_the_same_updates(self, gradient_accumulation_steps):
        runs = {}
        for optim in ("adamw_torch", "adamw_torch_fused"):
            trainer = get_fp16_trainer(
                self.get_auto_remove_tmp_dir(), optim, gradient_accumulation_steps, save_strategy="no"
            )
            trainer.train()
            logs = training_logs(trainer).values()
            runs[optim] = {
                "learning_rate": [entry["learning_rate"] for entry in logs],
                "loss_scale": [entry["loss_scale"] for entry in logs],
                "num_skipped_updates": [entry["num_skipped_updates"] for entry in logs],
                "global_step": trainer.state.global_step,
                "scheduler_steps": trainer.lr_scheduler.last_epoch,
            }
        self.assertEqual(runs["adamw_torch_fused"], runs["adamw_torch"])
        # The learning rate does not move on the skipped updates, and the scheduler only counts applied updates.
        learning_rates = runs["adamw_torch"]["learning_rate"]
        first, last = OVERFLOW_STEPS[0], OVERFLOW_STEPS[-1]
        self.assertEqual(learning_rates[first - 1 : last + 1], [learning_rates[first - 1]] * (len(OVERFLOW_STEPS) + 1))
        self.assertEqual(runs["adamw_torch"]["scheduler_steps"], MAX_STEPS - len(OVERFLOW_STEPS))

    @run_test_in_fresh_process(num_threads=1)
    def test_skipped_updates_are_logged_and_saved(self):
        output_dir = self.get_auto_remove_tmp_dir()
        trainer = get_fp16_trainer(output_dir)
        trainer.train()
        logs = training_logs(trainer)
        self.assertEqual(sorted(logs), list(range(1, MAX_STEPS + 1)))
        expected_counts = [sum(s <= step for s in OVERFLOW_STEPS) for step in logs]
        self.assertEqual([entry["num_skipped_updates"] for entry in logs.values()], expected_counts)
        self.assertEqual(logs[1]["loss_scale"], 2.0**10)
        # Each skipped update halves the scale.
        for step in OVERFLOW_STEPS:
            self.assertEqual(logs[step]["loss_scale"], logs[step - 1]["loss_scale"] / 2)
        self.assertEqual(get_num_skipped_updates(trainer.state), len(OVERFLOW_STEPS))
        saved = TrainerState.load_from_json(os.path.join(output_dir, "checkpoint-5", "trainer_state.json"))
        self.assertEqual(get_num_skipped_updates(saved), 2)

    @run_test_in_fresh_process(num_threads=1)
    def test_skipped_update_count_adds_no_trainer_state_field(self):
        # Versions that do not know the count must still load the checkpoint: `TrainerState.load_from_json` rejects
        # unknown fields, while `stateful_callbacks` entries of absent callbacks are ignored.
        output_dir = self.get_auto_remove_tmp_dir()
        get_fp16_trainer(output_dir, max_steps=6).train()
        with open(os.path.join(output_dir, "checkpoint-5", "trainer_state.json"), encoding="utf-8") as f:
            saved = json.load(f)
        self.assertNotIn("num_skipped_updates", saved)
        self.assertEqual(
            saved["stateful_callbacks"]["SkippedUpdatesMonitor"],
            {"args": {}, "attributes": {"num_skipped_updates": 2}},
        )

    @run_test_in_fresh_process(num_threads=1)
    def test_resume_restores_the_skipped_update_count(self):
        output_dir = self.get_auto_remove_tmp_dir()
        uninterrupted = get_fp16_trainer(output_dir)
        uninterrupted.train()
        resumed = get_fp16_trainer(self.get_auto_remove_tmp_dir(), restore_callback_states_from_checkpoint=True)
        with CaptureLogger(logging.get_logger("transformers.trainer")) as cl:
            resumed.train(resume_from_checkpoint=os.path.join(output_dir, "checkpoint-5"))
        # The count is not mistaken for the state of a missing callback.
        self.assertNotIn("SkippedUpdatesMonitor", cl.out)
        expected = {step: entry["num_skipped_updates"] for step, entry in training_logs(uninterrupted).items()}
        actual = {step: entry["num_skipped_updates"] for step, entry in training_logs(resumed).items()}
        self.assertEqual(actual, expected)
        self.assertEqual(get_num_skipped_updates(resumed.state), len(OVERFLOW_STEPS))

    @run_test_in_fresh_process(num_threads=1)
    def test_resume_trainer_state_without_skipped_update_count(self):
        # A `trainer_state.json` written by a version that does not count skipped updates: counting starts at the resume.
        output_dir = self.get_auto_remove_tmp_dir()
        get_fp16_trainer(output_dir, max_steps=6).train()
        state_file = os.path.join(output_dir, "checkpoint-5", "trainer_state.json")
        with open(state_file, encoding="utf-8") as f:
            state = json.load(f)
        del state["stateful_callbacks"]["SkippedUpdatesMonitor"]
        with open(state_file, "w", encoding="utf-8") as f:
            json.dump(state, f)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        trainer.train(resume_from_checkpoint=os.path.dirname(state_file))
        self.assertEqual(get_num_skipped_updates(trainer.state), 1)

    @parameterized.expand(
        [
            ("one_streak_of_11", range(1, 12), MAX_STEPS, [(10, 2.0**0)]),
            ("one_streak_of_21", range(1, 22), 22, [(10, 2.0**0), (20, 2.0**-10)]),
            ("two_streaks_of_9", [*range(1, 10), *range(11, 20)], 22, []),
        ]
    )
    @run_test_in_fresh_process(num_threads=1)
    def test_warning_on_consecutive_skipped_updates(self, _, overflow_steps, max_steps, expected_warnings):
        trainer = get_fp16_trainer(
            self.get_auto_remove_tmp_dir(), overflow_steps=overflow_steps, max_steps=max_steps, save_strategy="no"
        )
        with CaptureLogger(logging.get_logger("transformers.trainer_skipped_updates")) as cl:
            trainer.train()
        self.assertEqual(cl.out.count("optimizer updates were all skipped"), len(expected_warnings))
        for count, scale in expected_warnings:
            self.assertIn(
                f"The last {count} optimizer updates were all skipped because the gradients overflowed (loss scale "
                f"now {scale})",
                cl.out,
            )

    @parameterized.expand([("bf16",), ("fp32",)])
    @run_test_in_fresh_process(num_threads=1)
    def test_runs_without_scaler_log_as_before(self, precision):
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), precision=precision, save_strategy="no")
        trainer.train()
        for entry in training_logs(trainer).values():
            self.assertNotIn("loss_scale", entry)
            self.assertNotIn("num_skipped_updates", entry)
        # An injected overflow without a scaler is applied, not skipped: nothing counts it, nothing is stored.
        self.assertNotIn("SkippedUpdatesMonitor", trainer.state.stateful_callbacks)
        self.assertEqual(trainer.lr_scheduler.last_epoch, MAX_STEPS)


class SkippedUpdatesMonitorTest(unittest.TestCase):
    def run_steps(self, optimizer_kwargs, overflows, scale=None):
        """Runs one optimizer step per entry of `overflows`; returns the monitor's decision for each."""
        model = torch.nn.Linear(2, 2)
        accelerator = Accelerator(cpu=True)
        accelerator.scaler = scaler = torch.amp.GradScaler("cpu")
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), **optimizer_kwargs))
        self.state = TrainerState()
        monitor = SkippedUpdatesMonitor(accelerator, optimizer)
        decisions = []
        for overflow in overflows:
            scaler.scale(model(torch.ones(1, 2)).sum()).backward()
            if scale is not None:
                scaler._scale.fill_(scale)
            if overflow:
                model.weight.grad[0, 0] = float("inf")
            optimizer.step()
            decisions.append(monitor.optimizer_step_was_skipped(self.state))
            optimizer.zero_grad()
        self.monitor = monitor
        return decisions

    @parameterized.expand([("plain", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})])
    def test_detects_skip_with_any_optimizer(self, _, optimizer_kwargs):
        overflows = [False, True, True, False]
        self.assertEqual(self.run_steps(optimizer_kwargs, overflows), overflows)
        self.assertEqual(get_num_skipped_updates(self.state), 2)
        self.assertEqual(self.monitor.log_values(self.state), {"loss_scale": 2.0**14, "num_skipped_updates": 2})

    def test_detects_skip_after_scale_underflow(self):
        # What hundreds of overflows in a row leave behind: a scale of 0 that backing off does not lower any more.
        self.assertEqual(self.run_steps({"fused": True}, [True, True], scale=0.0), [True, True])
        self.assertEqual(self.monitor.log_values(self.state), {"loss_scale": 0.0, "num_skipped_updates": 2})

    def test_relies_on_accelerate_once_it_reports_skips_of_amp_aware_optimizers(self):
        # With an Accelerate release that has the fix, the scaler is not read: the decision is Accelerate's.
        with mock.patch("transformers.trainer_skipped_updates.is_accelerate_available", return_value=True):
            with mock.patch.object(torch.amp.GradScaler, "get_scale", side_effect=AssertionError("scaler read")):
                self.run_steps({"fused": True}, [False])
        self.assertIsNone(self.monitor._scale_before_step)

    @parameterized.expand(
        [
            ("not_a_dict", [3]),
            ("no_count", {"args": {}, "attributes": {}}),
            ("negative", {"args": {}, "attributes": {"num_skipped_updates": -1}}),
            ("string", {"args": {}, "attributes": {"num_skipped_updates": "3"}}),
        ]
    )
    def test_invalid_saved_count_is_a_clear_error(self, _, entry):
        state = TrainerState(stateful_callbacks={"SkippedUpdatesMonitor": entry})
        with self.assertRaisesRegex(ValueError, "Fix or delete it in the `trainer_state.json` of the checkpoint"):
            get_num_skipped_updates(state)

    def test_without_scaler_counts_skips_reported_by_the_accelerator(self):
        # DeepSpeed keeps its own loss scaler and reports its skips through the accelerator.
        accelerator = mock.Mock(scaler=None, optimizer_step_was_skipped=True)
        monitor = SkippedUpdatesMonitor(accelerator)
        state = TrainerState()
        self.assertTrue(monitor.optimizer_step_was_skipped(state))
        accelerator.optimizer_step_was_skipped = False
        self.assertFalse(monitor.optimizer_step_was_skipped(state))
        self.assertEqual(get_num_skipped_updates(state), 1)
        self.assertEqual(monitor.log_values(state), {})
