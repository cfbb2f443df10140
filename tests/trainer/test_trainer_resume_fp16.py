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

import hashlib
import json
import os
import shutil
import unittest
from pathlib import Path
from unittest import mock

import torch
from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.testing_isolation import run_test_in_fresh_process
from transformers.testing_utils import (
    CaptureLogger,
    LoggingLevel,
    TestCasePlus,
    require_torch_accelerator,
    torch_device,
)
from transformers.trainer_loss_scale import LossScaleMonitor, load_scaler_state, read_scaler_state
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging


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


class OnTrainBegin(TrainerCallback):
    def __init__(self, function):
        self.function = function

    def on_train_begin(self, args, state, control, **kwargs):
        self.function()


def resume_and_get_scaler_state(trainer, checkpoint):
    """Resumes `trainer` from `checkpoint`; returns the state of its scaler right after the checkpoint was loaded."""
    restored = []
    trainer.add_callback(OnTrainBegin(lambda: restored.append(trainer.accelerator.scaler.state_dict())))
    trainer.train(resume_from_checkpoint=checkpoint)
    (state,) = restored
    return state


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
    assert_exactly_equal(resumed.model.state_dict(), uninterrupted.model.state_dict(), "model")
    assert_exactly_equal(resumed.optimizer.state_dict(), uninterrupted.optimizer.state_dict(), "optimizer")
    assert_exactly_equal(resumed.lr_scheduler.state_dict(), uninterrupted.lr_scheduler.state_dict(), "scheduler")
    assert_exactly_equal(resumed.accelerator.scaler.state_dict(), uninterrupted.accelerator.scaler.state_dict())


def directory_digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(path).iterdir()) if p.is_file()}


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
        logs = training_logs(uninterrupted)
        self.assertEqual(logs[MAX_STEPS]["num_skipped_updates"], len(OVERFLOW_STEPS))
        scales = [entry["loss_scale"] for entry in logs.values()]
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


class TrainerSkippedUpdatesTest(TestCasePlus):
    @parameterized.expand([(1,), (2,)])
    @run_test_in_fresh_process
    def test_fused_and_unfused_optimizers_skip_the_same_updates(self, gradient_accumulation_steps):
        runs = {}
        for optim in ("adamw_torch", "adamw_torch_fused"):
            trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), optim, gradient_accumulation_steps)
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
        saved = trainer.state.load_from_json(os.path.join(output_dir, "checkpoint-5", "trainer_state.json"))
        self.assertEqual(saved.num_skipped_updates, 2)

    @parameterized.expand(
        [
            ("one_streak_of_11", range(1, 12), MAX_STEPS, [(10, 2.0**0)]),
            ("one_streak_of_21", range(1, 22), 22, [(10, 2.0**0), (20, 2.0**-10)]),
            ("two_streaks_of_9", [*range(1, 10), *range(11, 20)], 22, []),
        ]
    )
    def test_warning_on_consecutive_skipped_updates(self, _, overflow_steps, max_steps, expected_warnings):
        trainer = get_fp16_trainer(
            self.get_auto_remove_tmp_dir(), overflow_steps=overflow_steps, max_steps=max_steps, save_strategy="no"
        )
        with CaptureLogger(logging.get_logger("transformers.trainer_loss_scale")) as cl:
            trainer.train()
        self.assertEqual(cl.out.count("optimizer updates were all skipped"), len(expected_warnings))
        for count, scale in expected_warnings:
            self.assertIn(
                f"The last {count} optimizer updates were all skipped because the gradients overflowed (loss scale "
                f"now {scale})",
                cl.out,
            )

    @parameterized.expand([("bf16",), ("fp32",)])
    def test_runs_without_scaler_log_as_before(self, precision):
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), precision=precision, save_strategy="no")
        trainer.train()
        for entry in training_logs(trainer).values():
            self.assertNotIn("loss_scale", entry)
            self.assertNotIn("num_skipped_updates", entry)
        # An injected overflow without a scaler is applied, not skipped: nothing counts it as skipped.
        self.assertEqual(trainer.state.num_skipped_updates, 0)


class TrainerResumeFp16CheckpointTest(TestCasePlus):
    def setUp(self):
        super().setUp()
        self.output_dir = self.get_auto_remove_tmp_dir()
        get_fp16_trainer(self.output_dir, max_steps=6).train()
        self.checkpoint = os.path.join(self.output_dir, "checkpoint-5")

    @parameterized.expand([("bf16",), ("fp32",)])
    def test_resume_fp16_checkpoint_under_other_precision(self, precision):
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), precision=precision, max_steps=6)
        with LoggingLevel(logging.INFO), CaptureLogger(logging.get_logger("transformers.trainer_loss_scale")) as cl:
            trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(trainer.state.global_step, 6)
        message = f"Not restoring the loss scale saved in {os.path.join(self.checkpoint, 'scaler.pt')}"
        self.assertEqual(cl.out.count(message), 1)

    @parameterized.expand([("deleted",), ("saved_by_disabled_scaler",), ("bf16_checkpoint",)])
    def test_resume_checkpoint_without_loss_scale(self, case):
        if case == "deleted":
            os.remove(os.path.join(self.checkpoint, "scaler.pt"))
        elif case == "saved_by_disabled_scaler":
            torch.save(
                torch.amp.GradScaler("cpu", enabled=False).state_dict(), os.path.join(self.checkpoint, "scaler.pt")
            )
        else:
            self.output_dir = self.get_auto_remove_tmp_dir()
            get_fp16_trainer(self.output_dir, precision="bf16", max_steps=6).train()
            self.checkpoint = os.path.join(self.output_dir, "checkpoint-5")
            self.assertFalse(os.path.exists(os.path.join(self.checkpoint, "scaler.pt")))
        digest = directory_digest(self.checkpoint)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        with CaptureLogger(logging.get_logger("transformers.trainer_loss_scale")) as cl:
            trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(trainer.state.global_step, 6)
        self.assertEqual(cl.out.count(f"The checkpoint {self.checkpoint} has no saved loss scale"), 1)
        self.assertIn(f"restarts at its initial value {2.0**10}", cl.out)
        self.assertIn("may be skipped while the scale recalibrates", cl.out)
        self.assertEqual(directory_digest(self.checkpoint), digest)

    def test_resume_checkpoint_with_invalid_scaler_file(self):
        scaler_file = os.path.join(self.checkpoint, "scaler.pt")
        with open(scaler_file, "r+b") as f:
            f.truncate(os.path.getsize(scaler_file) // 2)
        digest = directory_digest(self.checkpoint)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        with self.assertRaisesRegex(ValueError, f"Cannot restore the loss scaler from {scaler_file}.*Delete"):
            trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(directory_digest(self.checkpoint), digest)

    def test_resume_restores_every_scaler_field(self):
        saved = {
            "scale": 96.0,
            "growth_factor": 3.0,
            "backoff_factor": 0.25,
            "growth_interval": 7,
            "_growth_tracker": 5,
        }
        torch.save(saved, os.path.join(self.checkpoint, "scaler.pt"))
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        self.assertEqual(resume_and_get_scaler_state(trainer, self.checkpoint), saved)

    def test_resume_save_only_model_checkpoint(self):
        output_dir = self.get_auto_remove_tmp_dir()
        get_fp16_trainer(output_dir, max_steps=3, save_only_model=True).train()
        checkpoint = get_last_checkpoint(output_dir)
        self.assertEqual(sorted(f for f in os.listdir(checkpoint) if f.endswith(".pt")), [])
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        with CaptureLogger(logging.get_logger("transformers.trainer_loss_scale")) as cl:
            trainer.train(resume_from_checkpoint=checkpoint)
        self.assertEqual(trainer.state.global_step, 6)
        self.assertIn(f"The checkpoint {checkpoint} has no saved loss scale", cl.out)

    def test_resume_checkpoint_without_optimizer_files(self):
        # A checkpoint that kept its loss scale but lost its optimizer and scheduler files still resumes, and the
        # loss scale is restored.
        for name in ("optimizer.pt", "scheduler.pt"):
            os.remove(os.path.join(self.checkpoint, name))
        saved = torch.load(os.path.join(self.checkpoint, "scaler.pt"), weights_only=True)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        self.assertEqual(resume_and_get_scaler_state(trainer, self.checkpoint), saved)
        self.assertEqual(trainer.state.global_step, 6)

    def test_resume_trainer_state_without_skipped_update_count(self):
        # `trainer_state.json` written before `num_skipped_updates` existed: counting starts from the resume.
        state_file = os.path.join(self.checkpoint, "trainer_state.json")
        with open(state_file, encoding="utf-8") as f:
            state = json.load(f)
        del state["num_skipped_updates"]
        with open(state_file, "w", encoding="utf-8") as f:
            json.dump(state, f)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(trainer.state.num_skipped_updates, sum(step == 6 for step in OVERFLOW_STEPS))


class _CodeInPickle:
    """Unpickling this runs code: a weights-only load must refuse it before anything runs."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (shutil.copy, (__file__, self.marker))


class ReadScalerStateTest(TestCasePlus):
    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.get_auto_remove_tmp_dir(), "scaler.pt")
        self.valid = torch.amp.GradScaler("cpu").state_dict()

    def save(self, state):
        torch.save(state, self.path)

    def test_round_trip(self):
        source = torch.amp.GradScaler(
            "cpu", init_scale=2.0**7, growth_factor=3.0, backoff_factor=0.25, growth_interval=5
        )
        source._lazy_init_scale_growth_tracker(torch.device("cpu"))
        source._growth_tracker.fill_(4)
        self.save(source.state_dict())
        target = torch.amp.GradScaler("cpu")
        load_scaler_state(target, os.path.dirname(self.path))
        self.assertEqual(target.state_dict(), source.state_dict())

    @parameterized.expand(
        [
            ("truncated", lambda data: data[: len(data) // 2], "not a readable torch file"),
            ("garbage", lambda data: b"not a checkpoint\n" * 8, "the weights-only loader refused it"),
            ("empty", lambda data: b"", "not a readable torch file"),
        ]
    )
    def test_unreadable_file(self, _, corrupt, problem):
        self.save(self.valid)
        data = Path(self.path).read_bytes()
        Path(self.path).write_bytes(corrupt(data))
        self.assert_invalid(problem)

    @parameterized.expand(
        [
            ("not_a_dict", lambda valid: list(valid.values()), "it holds a list, not a dict"),
            ("missing_keys", lambda valid: {"scale": 1.0}, "it misses the key(s) 'growth_factor'"),
            (
                "infinite_scale",
                lambda valid: valid | {"scale": float("inf")},
                "'scale' is inf, expected a finite positive",
            ),
            ("nan_scale", lambda valid: valid | {"scale": float("nan")}, "'scale' is nan"),
            ("zero_scale", lambda valid: valid | {"scale": 0.0}, "'scale' is 0.0: the loss scale underflowed"),
            ("negative_scale", lambda valid: valid | {"scale": -2.0}, "'scale' is -2.0"),
            ("growth_factor_one", lambda valid: valid | {"growth_factor": 1.0}, "'growth_factor' is 1.0"),
            ("backoff_factor_one", lambda valid: valid | {"backoff_factor": 1.0}, "expected a number > 0 and < 1"),
            ("string_scale", lambda valid: valid | {"scale": "65536"}, "'scale' is '65536'"),
            ("float_interval", lambda valid: valid | {"growth_interval": 2.5}, "'growth_interval' is 2.5"),
            ("negative_tracker", lambda valid: valid | {"_growth_tracker": -1}, "expected an integer >= 0"),
        ]
    )
    def test_invalid_state(self, _, make_state, problem):
        self.save(make_state(self.valid))
        self.assert_invalid(problem)

    def test_pickle_with_code_is_refused_without_running_it(self):
        marker = os.path.join(os.path.dirname(self.path), "code-ran")
        self.save({**self.valid, "scale": _CodeInPickle(marker)})
        self.assert_invalid(
            "the weights-only loader refused it (Unsupported global: GLOBAL shutil.copy was not an allowed global by default)"
        )
        self.assertFalse(os.path.exists(marker))

    def test_read_errors_are_not_reported_as_invalid_files(self):
        self.save(self.valid)
        with mock.patch("torch.load", side_effect=PermissionError(13, "Permission denied")):
            with self.assertRaises(PermissionError):
                read_scaler_state(self.path)

    def test_disabled_scaler_state_is_not_an_error(self):
        self.save(torch.amp.GradScaler("cpu", enabled=False).state_dict())
        self.assertEqual(read_scaler_state(self.path), {})

    def assert_invalid(self, problem):
        data = Path(self.path).read_bytes()
        with self.assertRaises(ValueError) as context:
            load_scaler_state(torch.amp.GradScaler("cpu"), os.path.dirname(self.path))
        message = str(context.exception)
        self.assertIn(f"Cannot restore the loss scaler from {self.path}", message)
        self.assertIn(problem, message)
        self.assertIn(f"Delete {self.path} to resume with the loss scale restarted", message)
        self.assertNotIn("weights_only", message)
        self.assertNotIn("safe_globals", message)
        self.assertEqual(Path(self.path).read_bytes(), data)


class LossScaleMonitorTest(unittest.TestCase):
    @parameterized.expand([("foreach", {"foreach": True}), ("fused", {"fused": True})])
    def test_detects_skip_with_any_optimizer(self, _, optimizer_kwargs):
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters(), **optimizer_kwargs)
        scaler = torch.amp.GradScaler("cpu")
        monitor = LossScaleMonitor(scaler)
        state = mock.Mock(num_skipped_updates=0)
        for overflow in (False, True, True, False):
            scaler.scale(model(torch.ones(1, 2)).sum()).backward()
            if overflow:
                model.weight.grad[0, 0] = float("inf")
            monitor.before_optimizer_step()
            scaler.step(optimizer)
            scaler.update()
            self.assertEqual(monitor.optimizer_step_was_skipped(state, accelerator_step_was_skipped=False), overflow)
            optimizer.zero_grad()
        self.assertEqual(state.num_skipped_updates, 2)
        self.assertEqual(monitor.log_values(state), {"loss_scale": 2.0**14, "num_skipped_updates": 2})

    def test_detects_skip_after_scale_underflow(self):
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        scaler = torch.amp.GradScaler("cpu")
        monitor = LossScaleMonitor(scaler)
        state = mock.Mock(num_skipped_updates=0)
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        scaler._scale.fill_(0.0)  # what hundreds of overflows in a row leave behind
        for overflow in (True, False):
            if overflow:
                model.weight.grad[0, 0] = float("inf")
            monitor.before_optimizer_step()
            scaler.step(optimizer)
            scaler.update()
            self.assertEqual(scaler.get_scale(), 0.0)
            self.assertEqual(monitor.optimizer_step_was_skipped(state, accelerator_step_was_skipped=False), overflow)
            model.weight.grad.zero_()

    def test_without_scaler_counts_skips_reported_by_the_accelerator(self):
        # DeepSpeed keeps its own loss scaler and reports its skips through the accelerator.
        monitor = LossScaleMonitor(None)
        state = mock.Mock(num_skipped_updates=0)
        monitor.before_optimizer_step()
        self.assertTrue(monitor.optimizer_step_was_skipped(state, accelerator_step_was_skipped=True))
        self.assertFalse(monitor.optimizer_step_was_skipped(state, accelerator_step_was_skipped=False))
        self.assertEqual(state.num_skipped_updates, 1)
        self.assertEqual(monitor.log_values(state), {})
