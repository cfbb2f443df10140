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
Resuming fp16 mixed precision training restores the loss scaler, and matches the uninterrupted run bit for bit (#34053).
The parity tests are #34053's regression tests: they pass since #34932 restores the scaler, and fail if that restore is
lost again.

On CPU, Accelerate builds no `GradScaler` for fp16, so these tests give the Trainer's accelerator a CPU
`torch.amp.GradScaler` and turn on its autocast: the forward really runs in fp16 and the loss scale really moves. On an
accelerator (`@slow`), the scaler is the one Accelerate builds for the device.
"""

import datetime
import os
import pickle

from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.testing_utils import (
    CaptureLogger,
    LoggingLevel,
    TestCasePlus,
    require_torch,
    require_torch_accelerator,
    require_torch_non_multi_accelerator,
    run_test_using_subprocess,
    slow,
)
from transformers.utils import is_torch_available, logging


if is_torch_available():
    import torch


# Update attempts whose gradients overflow (a streak of three skipped updates). With an initial scale of 2**10 and
# `growth_interval=3`, the scale grows after attempts 3 and 9: attempt 5 is inside the streak, 8 just before a growth
# and 9 just after one. Overflows and checkpoints are keyed on the callback's own count of attempts, not on
# `state.global_step`, which Trainer versions advance differently on skipped updates.
OVERFLOW_ATTEMPTS = (4, 5, 6)
RESUME_ATTEMPTS = {"inside_overflow_streak": 5, "before_scale_growth": 8, "after_scale_growth": 9}
SCALER_SETTINGS = {"scale": 2.0**10, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}
# The loss scale after each of the first 9 attempts.
EXPECTED_SCALES = [2.0**10, 2.0**10, 2.0**11, 2.0**10, 2.0**9, 2.0**8, 2.0**8, 2.0**8, 2.0**9]


class RandomTokenDataset:
    def __init__(self, length=64, seq_length=16, vocab_size=64):
        generator = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(0, vocab_size, (length, seq_length), generator=generator)

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.input_ids[i]}


class Fp16ScenarioCallback(TrainerCallback):
    """
    Counts update attempts from `attempts` on, turns a gradient entry into `inf` in the attempts of
    `OVERFLOW_ATTEMPTS`, records the learning rate and loss scale after each attempt, and saves a checkpoint at the
    first update after each attempt of `save_attempts` (a Trainer that does not end a skipped update with a step
    cannot save inside an overflow streak).
    """

    def __init__(self, scaler, save_attempts=(), attempts=0):
        self.scaler, self.pending_saves, self.attempts = scaler, sorted(save_attempts), attempts
        self.checkpoints, self.trace = {}, {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.get_input_embeddings().weight.register_hook(self._overflow)

    def _overflow(self, grad):
        if self.attempts not in OVERFLOW_ATTEMPTS:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad

    def _record(self, optimizer):
        self.trace[self.attempts] = (optimizer.param_groups[0]["lr"], self.scaler.get_scale())

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        self._record(optimizer)  # the state the previous attempt left, or the resumed one
        self.attempts += 1

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        self._record(optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = bool(self.pending_saves) and self.pending_saves[0] <= self.attempts

    def on_save(self, args, state, control, **kwargs):
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.checkpoints[self.pending_saves.pop(0)] = (checkpoint, self.attempts)


def get_fp16_trainer(output_dir, optim, gradient_accumulation_steps, save_attempts=(), attempts=0, use_cpu=True):
    """A tiny GPT-2 Trainer training in fp16 with a loss scaler that backs off and grows within a few attempts."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=12,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=gradient_accumulation_steps,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        optim=optim,
        fp16=True,
        use_cpu=use_cpu,
        save_strategy="no",
        logging_steps=1,
        seed=42,
        # CPU kernels are deterministic as they are; on an accelerator, bit-exactness needs deterministic algorithms
        full_determinism=not use_cpu,
        report_to=[],
    )
    trainer = Trainer(GPT2LMHeadModel(config), args, train_dataset=RandomTokenDataset())
    if trainer.accelerator.scaler is None:  # CPU: Accelerate builds no scaler for fp16 there
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
        trainer.accelerator.native_amp = True
    scaler = trainer.accelerator.scaler
    scaler.load_state_dict({**scaler.state_dict(), **SCALER_SETTINGS})
    scenario = Fp16ScenarioCallback(scaler, save_attempts, attempts)
    trainer.add_callback(scenario)
    return trainer, scenario


def training_record(trainer, scenario, first_attempt):
    """What the parity tests compare: the learning rate and loss scale after each attempt, the logs, the final states."""
    return {
        "learning rate and loss scale after each attempt": {
            attempt: values for attempt, values in scenario.trace.items() if attempt >= first_attempt
        },
        "log history": [entry for entry in trainer.state.log_history if "loss" in entry],
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "lr_scheduler": trainer.lr_scheduler.state_dict(),
        "scaler": trainer.accelerator.scaler.state_dict(),
    }


def assert_same_training(resumed, uninterrupted):
    """The resumed run matches the uninterrupted one bit for bit from its first attempt on."""
    first_attempt = min(resumed[1].trace)
    actual, expected = (training_record(*run, first_attempt) for run in (resumed, uninterrupted))
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@require_torch
class TrainerLoadScalerTest(TestCasePlus):
    def load_scaler(self, precision, scaler=None, scaler_state=None, level=logging.INFO):
        """`Trainer._load_scaler` on a checkpoint with `scaler_state` (None: no `scaler.pt`), and what it logged."""
        checkpoint = self.get_auto_remove_tmp_dir()
        if scaler_state is not None:
            torch.save(scaler_state, os.path.join(checkpoint, "scaler.pt"))
        args = TrainingArguments(self.get_auto_remove_tmp_dir(), use_cpu=True, report_to=[], **precision)
        trainer = Trainer(torch.nn.Linear(2, 2), args)
        if scaler is not None:  # Accelerate creates no loss scaler for fp16 on CPU
            trainer.accelerator.scaler = scaler
        with LoggingLevel(level), CaptureLogger(logging.get_logger("transformers.trainer")) as cl:
            trainer._load_scaler(checkpoint)
        return checkpoint, cl.out

    @parameterized.expand([("fp32", {}), ("bf16", {"bf16": True}), ("disabled_scaler", {"fp16": True}, False)])
    def test_resume_without_loss_scaling(self, _, precision, scaler_enabled=None):
        scaler = None if scaler_enabled is None else torch.amp.GradScaler("cpu", enabled=scaler_enabled)
        scaler_state = torch.amp.GradScaler("cpu", init_scale=256.0).state_dict()
        checkpoint, out = self.load_scaler(precision, scaler, scaler_state)
        self.assertIn(f"Not loading scaler.pt from {checkpoint}: this run does not scale the loss.", out)
        self.assertEqual(self.load_scaler(precision, scaler, scaler_state, level=logging.WARNING)[1], "")  # info
        self.assertEqual(self.load_scaler(precision, scaler)[1], "")  # no scaler.pt, nothing to say

    def test_resume_with_scaler_state(self):
        scaler, scaler_state = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu", init_scale=256.0).state_dict()
        _, out = self.load_scaler({"fp16": True}, scaler, scaler_state)
        self.assertEqual(scaler.get_scale(), 256.0)
        self.assertEqual(out, "")

    # No scaler.pt (e.g. a checkpoint of a release that saved no scaler state), or the `{}` a disabled scaler was saved
    # as: the loss scale restarts, logged at the level of the other restores' missing files
    @parameterized.expand([("missing", None), ("empty", {})])
    def test_resume_without_scaler_state(self, _, scaler_state):
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(1))
        scaler.update(512.0)  # the scale the run goes on with, not the one it was built with, is named
        checkpoint, out = self.load_scaler({"fp16": True}, scaler, scaler_state)
        self.assertEqual(scaler.get_scale(), 512.0)
        self.assertIn(f"No loss scaler state in {checkpoint} (scaler.pt missing or empty): the fp16 loss scale", out)
        self.assertIn("restarts at 512.0, and the first updates may be skipped", out)
        out = self.load_scaler({"fp16": True}, torch.amp.GradScaler("cpu"), scaler_state, level=logging.WARNING)[1]
        self.assertEqual(out, "")
        if scaler_state is not None:  # loading leaves the checkpoint as it was
            self.assertEqual(torch.load(os.path.join(checkpoint, "scaler.pt")), scaler_state)

    # torch's errors, as for the other states: a damaged file, and one holding more than tensors and plain values
    # (loaded weights only, so its code never runs)
    @parameterized.expand([("truncated", RuntimeError), ("not_weights_only", pickle.UnpicklingError)])
    def test_resume_corrupt_scaler_state(self, damage, error):
        path = os.path.join(self.get_auto_remove_tmp_dir(), "scaler.pt")
        if damage == "truncated":
            torch.save(torch.amp.GradScaler("cpu", init_scale=256.0).state_dict(), path)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(f.name) // 2)
        else:
            torch.save({"scale": datetime.date(2026, 12, 4)}, path)
        args = TrainingArguments(self.get_auto_remove_tmp_dir(), use_cpu=True, report_to=[], fp16=True)
        trainer = Trainer(torch.nn.Linear(2, 2), args)
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        with self.assertRaises(error):
            trainer._load_scaler(os.path.dirname(path))
        self.assertEqual(trainer.accelerator.scaler.get_scale(), 1024.0)

    def test_resume_checkpoint_saved_with_disabled_scaler(self):
        # A disabled scaler has no state to save: an enabled one refuses to load its empty `state_dict()`
        args = TrainingArguments(self.get_auto_remove_tmp_dir(), use_cpu=True, report_to=[], fp16=True)
        trainer = Trainer(torch.nn.Linear(2, 2), args)
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", enabled=False)
        checkpoint = self.get_auto_remove_tmp_dir()
        trainer._save_scaler(checkpoint)
        self.assertFalse(os.path.exists(os.path.join(checkpoint, "scaler.pt")))
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        trainer._load_scaler(checkpoint)
        self.assertEqual(trainer.accelerator.scaler.get_scale(), 1024.0)
        # An enabled scaler is saved
        trainer._save_scaler(checkpoint)
        self.assertEqual(torch.load(os.path.join(checkpoint, "scaler.pt"))["scale"], 1024.0)


@require_torch
class TrainerResumeFp16Test(TestCasePlus):
    def check_parity(
        self, optim, gradient_accumulation_steps=(1, 2), resume_points=tuple(RESUME_ATTEMPTS), use_cpu=True
    ):
        attempts = {resume_point: RESUME_ATTEMPTS[resume_point] for resume_point in resume_points}
        for accumulation in gradient_accumulation_steps:
            output_dir = self.get_auto_remove_tmp_dir()
            uninterrupted = get_fp16_trainer(output_dir, optim, accumulation, attempts.values(), use_cpu=use_cpu)
            uninterrupted[0].train()
            # The scenario really exercises the loss scale: it backed off at each overflow and grew in between
            scales = [uninterrupted[1].trace[attempt][1] for attempt in range(1, len(EXPECTED_SCALES) + 1)]
            self.assertEqual(scales, EXPECTED_SCALES)
            for resume_point, attempt in attempts.items():
                with self.subTest(resume_point=resume_point, gradient_accumulation_steps=accumulation):
                    checkpoint, saved_at_attempt = uninterrupted[1].checkpoints[attempt]
                    output_dir = self.get_auto_remove_tmp_dir()
                    resumed = get_fp16_trainer(
                        output_dir, optim, accumulation, attempts=saved_at_attempt, use_cpu=use_cpu
                    )
                    resumed[0].train(resume_from_checkpoint=checkpoint)
                    assert_same_training(resumed, uninterrupted)

    # In every CI run: the default optimizer, on CPU, resumed where the loss scale and its growth tracker matter. The
    # slow runs add the resume after a growth, gradient accumulation, the other optimizers and the accelerator.
    def test_resume_matches_uninterrupted_run(self):
        """#34053's regression test: passes since #34932 restores the loss scaler, fails if that restore is lost."""
        self.check_parity("adamw_torch_fused", (1,), resume_points=("inside_overflow_streak", "before_scale_growth"))

    @parameterized.expand([("adamw_torch_fused",), ("adamw_torch",), ("sgd",)])
    @slow
    def test_resume_matches_uninterrupted_run_slow(self, optim):
        self.check_parity(optim)

    @slow
    @require_torch_accelerator
    @require_torch_non_multi_accelerator
    @run_test_using_subprocess
    def test_resume_matches_uninterrupted_run_on_accelerator(self):
        # Real fp16 on the device, with the `GradScaler` Accelerate builds for it (set to `SCALER_SETTINGS`).
        # `full_determinism=True` leaves deterministic algorithms and `CUBLAS_WORKSPACE_CONFIG` set for the rest of
        # the process (later tests' ops without a deterministic implementation would raise), hence the subprocess.
        self.check_parity("adamw_torch_fused", use_cpu=False)
