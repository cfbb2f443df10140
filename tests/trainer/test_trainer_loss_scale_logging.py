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
Training logs carry the fp16 loss scale (`grad_scale`), and only when the loss is scaled. Accelerate builds a
`GradScaler` for fp16 on accelerators only, so on CPU the fp16 test gives the Trainer's accelerator a CPU one (and fp16
autocast), as Accelerate does on an accelerator. The overflow is injected by update attempt, not by `global_step`.
"""

import os

from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainerState, TrainingArguments
from transformers.testing_utils import TestCasePlus, require_torch, torch_device
from transformers.utils import is_torch_available


if is_torch_available():
    import torch


OVERFLOW_ATTEMPT = 4
TRAINING_KWARGS = {"max_steps": 6, "per_device_train_batch_size": 2, "logging_steps": 1, "report_to": []}


class OverflowAtAttempt(TrainerCallback):
    """Turns one gradient entry into `inf` on update attempt `attempt`; records the attempt of each training log entry."""

    def __init__(self, attempt):
        self.overflow_attempt, self.attempts, self.logged_at = attempt, 0, []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.get_input_embeddings().weight.register_hook(self._maybe_overflow)

    def on_step_begin(self, args, state, control, **kwargs):
        self.attempts += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.logged_at.append(self.attempts)

    def _maybe_overflow(self, grad):
        if self.attempts == self.overflow_attempt:
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad


@require_torch
class TrainerLossScaleLoggingTest(TestCasePlus):
    def get_trainer(self, **kwargs):
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=32, n_embd=8, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config)
        input_ids = torch.randint(0, 32, (64, 8), generator=torch.Generator().manual_seed(0))
        train_dataset = [{"input_ids": ids, "labels": ids} for ids in input_ids]
        output_dir = self.get_auto_remove_tmp_dir()
        args = TrainingArguments(output_dir, use_cpu=torch_device == "cpu", **{**TRAINING_KWARGS, **kwargs})
        recorder = OverflowAtAttempt(OVERFLOW_ATTEMPT)
        trainer = Trainer(model=model, args=args, train_dataset=train_dataset)
        trainer.add_callback(recorder)
        return trainer, recorder

    def get_fp16_trainer(self, scale, **kwargs):
        trainer, recorder = self.get_trainer(fp16=True, **kwargs)
        if trainer.accelerator.scaler is None:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
            trainer.accelerator.native_amp = True
        scaler = trainer.accelerator.scaler
        scaler.load_state_dict({**scaler.state_dict(), "scale": scale, "growth_interval": 1})
        return trainer, recorder

    def test_fp16_logs_grad_scale(self):
        # The scale doubles after every update and halves on the overflow: each logged value names its attempt
        trainer, recorder = self.get_fp16_trainer(64.0, save_strategy="steps", save_steps=TRAINING_KWARGS["max_steps"])
        trainer.train()
        checkpoint = os.path.join(trainer.args.output_dir, f"checkpoint-{trainer.state.global_step}")
        saved_state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        expected, scale = {}, 64.0
        for attempt in range(1, max(recorder.logged_at) + 1):
            scale = scale / 2 if attempt == OVERFLOW_ATTEMPT else scale * 2
            expected[attempt] = scale
        for log_history in (trainer.state.log_history, saved_state.log_history):
            logged = [entry.get("grad_scale") for entry in log_history if "loss" in entry]
            logged = dict(zip(recorder.logged_at, logged, strict=True))
            # Every update is logged (whether or not the skipped one is), with the scale after it, as a Python float
            self.assertLessEqual({1, 2, 3, 5, 6}, set(logged))
            self.assertEqual(logged, {attempt: expected[attempt] for attempt in logged})
            self.assertEqual({type(scale) for scale in logged.values()}, {float})

    def test_fp16_logs_zero_grad_scale(self):
        # A scale of 0.0 makes every update overflow (and stays 0.0): it is logged, not dropped as falsy
        trainer, _ = self.get_fp16_trainer(0.0, max_steps=2)
        trainer.train()
        logged = [entry.get("grad_scale") for entry in trainer.state.log_history if "loss" in entry]
        self.assertTrue(logged)
        self.assertEqual(logged, [0.0] * len(logged))

    @parameterized.expand([("fp32", {}), ("fp16_with_disabled_scaler", {"fp16": True})])
    def test_no_grad_scale_without_loss_scaling(self, _, precision):
        # bf16 and fp32 have no loss scaler: the same code path. A disabled scaler reports a scale of 1.0, unused.
        trainer = self.get_trainer(**precision)[0]
        if precision:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu", enabled=False)
            trainer.accelerator.native_amp = True
        trainer.train()
        entries = [entry for entry in trainer.state.log_history if "loss" in entry]
        self.assertTrue(entries)
        self.assertFalse(any("grad_scale" in entry for entry in entries))
