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
Training logs carry the fp16 loss scale (`loss_scale`), and only when the loss is scaled. Accelerate builds a
`GradScaler` for fp16 on accelerators only, so on CPU the fp16 test gives the Trainer's accelerator a CPU one (and fp16
autocast), as Accelerate does on an accelerator. The overflow is injected by update attempt, not by `global_step`.
"""

import torch
from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.integrations.deepspeed import unset_hf_deepspeed_config
from transformers.testing_utils import (
    TestCasePlus,
    get_torch_dist_unique_port,
    is_torch_bf16_available_on_device,
    mockenv_context,
    require_deepspeed,
    require_torch,
    torch_device,
)


OVERFLOW_ATTEMPT = 4
DIST_ENV_1_PROCESS = {"MASTER_ADDR": "localhost", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
TRAINING_KWARGS = {"max_steps": 8, "per_device_train_batch_size": 2, "logging_steps": 1, "report_to": []}


class OverflowAtAttempt(TrainerCallback):
    """Turns one gradient entry into `inf` on update attempt `attempt`; records the attempt of each training log."""

    def __init__(self, attempt):
        self.overflow_attempt, self.attempts, self.logged_at = attempt, 0, []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.get_input_embeddings().weight.register_hook(self._maybe_overflow)

    def on_step_begin(self, args, state, control, **kwargs):
        self.attempts += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.logged_at.append((self.attempts, logs))

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
        args = TrainingArguments(output_dir, use_cpu=torch_device == "cpu", **TRAINING_KWARGS, **kwargs)
        recorder = OverflowAtAttempt(OVERFLOW_ATTEMPT)
        trainer = Trainer(model=model, args=args, train_dataset=train_dataset)
        trainer.add_callback(recorder)
        return trainer, recorder

    def check_loss_scale_logs(self, recorder, initial_scale, final_scale):
        entries = recorder.logged_at
        self.assertTrue(entries and all("loss_scale" in logs for _, logs in entries))
        self.assertEqual(entries[0][1]["loss_scale"], initial_scale)
        self.assertEqual(entries[-1][1]["loss_scale"], final_scale)
        before = [logs for attempt, logs in entries if attempt < OVERFLOW_ATTEMPT][-1]
        after = [logs for attempt, logs in entries if attempt >= OVERFLOW_ATTEMPT][0]
        self.assertEqual(after["loss_scale"], before["loss_scale"] / 2)

    def test_fp16_logs_loss_scale(self):
        trainer, recorder = self.get_trainer(fp16=True)
        if trainer.accelerator.scaler is None:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
            trainer.accelerator.native_amp = True
        scaler = trainer.accelerator.scaler
        scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0**10})
        trainer.train()
        self.check_loss_scale_logs(recorder, 2.0**10, scaler.get_scale())

    @parameterized.expand([("bf16",), ("fp32",)])
    def test_no_loss_scale_without_fp16(self, precision):
        if precision == "bf16" and not is_torch_bf16_available_on_device(torch_device):
            self.skipTest(reason="test requires device with bf16 support")
        trainer, recorder = self.get_trainer(bf16=precision == "bf16")
        trainer.train()
        self.assertGreater(len(recorder.logged_at), 0)
        self.assertFalse(any("loss_scale" in logs for _, logs in recorder.logged_at))

    @require_deepspeed
    def test_deepspeed_fp16_logs_loss_scale(self):
        from deepspeed.accelerator import get_accelerator

        self.addCleanup(unset_hf_deepspeed_config)
        if not get_accelerator().is_fp16_supported():
            self.skipTest(reason=f"DeepSpeed's {get_accelerator().device_name()} accelerator does not support fp16")
        # hysteresis=1: DeepSpeed halves the loss scale on the first overflow, as GradScaler does
        fp16 = {"enabled": "auto", "initial_scale_power": 10, "loss_scale_window": 1000, "hysteresis": 1}
        ds_config = {"fp16": fp16, "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}
        with mockenv_context(**DIST_ENV_1_PROCESS, MASTER_PORT=str(get_torch_dist_unique_port())):
            trainer, recorder = self.get_trainer(fp16=True, deepspeed=ds_config)
            trainer.train()
        self.check_loss_scale_logs(recorder, 2.0**10, trainer.deepspeed.optimizer.loss_scale)
