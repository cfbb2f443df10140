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
fp16 updates skipped on a gradient overflow must not advance the LR scheduler, whether `GradScaler.step` skips
`optimizer.step()` (`adamw_torch`, `sgd`) or an AMP-aware optimizer skips the update itself (`adamw_torch_fused`).

Overflows are injected by update attempt (`on_step_begin` calls), never by `global_step`, which need not advance on a
skipped update. Accelerate builds a `GradScaler` for fp16 on accelerators only, so on CPU the tests give the Trainer's
accelerator a CPU one (with fp16 autocast), as Accelerate does on an accelerator.
"""

import torch
from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.optimization import get_linear_schedule_with_warmup
from transformers.testing_utils import TestCasePlus, require_torch, torch_device


MAX_STEPS = 10
LEARNING_RATE = 1e-3
OVERFLOW_ATTEMPTS = (3, 4, 7)


class RandomTokenDataset(torch.utils.data.Dataset):
    def __init__(self, length=64, seq_length=8, vocab_size=32):
        self.input_ids = torch.randint(0, vocab_size, (length, seq_length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.input_ids[i]}


class UpdateAttemptRecorder(TrainerCallback):
    """
    Counts update attempts, turns one gradient entry into `inf` on the attempts in `overflow_attempts`, and records
    per attempt the learning rate, the loss scale and the embedding weights before it (and once more after training).
    """

    def __init__(self, scaler, overflow_attempts=()):
        self.scaler = scaler
        self.overflow_attempts = set(overflow_attempts)
        self.attempts = 0
        self.learning_rates, self.loss_scales, self.weights = [], [], []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.get_input_embeddings().weight.register_hook(self._maybe_overflow)

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.attempts += 1
        self.learning_rates.append(optimizer.param_groups[0]["lr"])
        self._record(model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._record(model)

    def _record(self, model):
        self.loss_scales.append(self.scaler.get_scale())
        self.weights.append(model.get_input_embeddings().weight.detach().clone())

    def _maybe_overflow(self, grad):
        if self.attempts not in self.overflow_attempts:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad


def tiny_causal_lm_loss(outputs, labels, num_items_in_batch=None):
    """The causal LM loss times 1e-37: the gradients stay finite even under a loss scale of 2**127."""
    logits = outputs.logits[:, :-1].flatten(0, 1).float()
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:].flatten()) * 1e-37


@require_torch
class TrainerFusedOptimizerSkipTest(TestCasePlus):
    def train(self, optim, overflow_attempts=(), scaler_state=None, **kwargs):
        torch.manual_seed(0)
        config = GPT2Config(
            vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
        )
        args = TrainingArguments(
            output_dir=self.get_auto_remove_tmp_dir(),
            max_steps=MAX_STEPS,
            per_device_train_batch_size=2,
            learning_rate=LEARNING_RATE,
            lr_scheduler_type="linear",
            weight_decay=0.1,
            optim=optim,
            fp16=True,
            use_cpu=torch_device == "cpu",
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=RandomTokenDataset(), **kwargs)
        if trainer.accelerator.scaler is None:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
            trainer.accelerator.native_amp = True
        scaler = trainer.accelerator.scaler
        scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0**10, **(scaler_state or {})})
        recorder = UpdateAttemptRecorder(scaler, overflow_attempts)
        trainer.add_callback(recorder)
        trainer.train()
        return trainer, recorder

    @parameterized.expand([("adamw_torch",), ("adamw_torch_fused",), ("sgd",)])
    def test_skipped_updates_do_not_step_the_scheduler(self, optim):
        trainer, recorder = self.train(optim, OVERFLOW_ATTEMPTS)
        skipped = [attempt in OVERFLOW_ATTEMPTS for attempt in range(1, recorder.attempts + 1)]
        self.assertEqual(sum(skipped), len(OVERFLOW_ATTEMPTS))
        self.assertEqual(trainer.lr_scheduler.last_epoch, recorder.attempts - len(OVERFLOW_ATTEMPTS))

        # Attempt i uses the LR of the schedule after the updates applied before it
        reference = get_linear_schedule_with_warmup(torch.optim.SGD([torch.zeros(1)], lr=LEARNING_RATE), 0, MAX_STEPS)
        expected_learning_rates = []
        for was_skipped in skipped:
            expected_learning_rates.append(reference.get_last_lr()[0])
            if not was_skipped:
                reference.optimizer.step()
                reference.step()
        self.assertEqual(recorder.learning_rates, expected_learning_rates)

        # A skipped attempt halves the loss scale (growth_interval=2000: it never grows here) and leaves the weights
        for i, was_skipped in enumerate(skipped):
            expected_scale = recorder.loss_scales[i] / 2 if was_skipped else recorder.loss_scales[i]
            self.assertEqual(recorder.loss_scales[i + 1], expected_scale)
            self.assertEqual(torch.equal(recorder.weights[i], recorder.weights[i + 1]), was_skipped)
        self.assertEqual(trainer.accelerator.scaler.get_scale(), 2.0**10 / 2 ** len(OVERFLOW_ATTEMPTS))

    @parameterized.expand([("adamw_torch",), ("adamw_torch_fused",)])
    def test_loss_scale_at_float32_cap_is_not_a_skip(self, optim):
        # 2**128 overflows float32, so each attempted growth leaves the scale unchanged: every update is applied
        trainer, recorder = self.train(
            optim, scaler_state={"scale": 2.0**127, "growth_interval": 1}, compute_loss_func=tiny_causal_lm_loss
        )
        self.assertEqual(recorder.attempts, MAX_STEPS)
        self.assertEqual(trainer.lr_scheduler.last_epoch, MAX_STEPS)
        self.assertEqual(recorder.loss_scales, [2.0**127] * (MAX_STEPS + 1))
        for before, after in zip(recorder.weights, recorder.weights[1:]):
            self.assertFalse(torch.equal(before, after))
