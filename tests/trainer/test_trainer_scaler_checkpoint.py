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
Restoring the fp16 loss scaler (`scaler.pt`) on resume: precision changes, checkpoints without a loss scale, invalid
files. On CPU, Accelerate builds no `GradScaler`, so the tests put a `torch.amp.GradScaler("cpu")` on the Trainer's
accelerator and turn on autocast: the forward really runs in fp16 and the loss scale really moves.
"""

import hashlib
import os
import shutil
from pathlib import Path
from unittest import mock

import torch
from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.testing_isolation import run_test_in_fresh_process
from transformers.testing_utils import CaptureLogger, LoggingLevel, TestCasePlus
from transformers.trainer_loss_scale import load_scaler_state, read_scaler_state
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging


class RandomTokenDataset(torch.utils.data.Dataset):
    def __init__(self, length=64, seq_length=16, vocab_size=64):
        generator = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(0, vocab_size, (length, seq_length), generator=generator)

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"input_ids": self.input_ids[i], "labels": self.input_ids[i]}


class OnTrainBegin(TrainerCallback):
    def __init__(self, function):
        self.function = function

    def on_train_begin(self, args, state, control, **kwargs):
        self.function()


def get_fp16_trainer(output_dir, precision="fp16", max_steps=6, **kwargs):
    """
    A tiny GPT-2 Trainer on CPU that saves at step 5 and at the end (the tests resume from checkpoint-5). `precision` is
    "fp16" (with a loss scaler), "bf16" or "fp32".
    """
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    )
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        use_cpu=True,
        save_steps=5,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        **kwargs,
    )
    trainer = Trainer(model, args, train_dataset=RandomTokenDataset())
    if precision == "fp16":
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
        trainer.accelerator.native_amp = True
    return trainer


def resume_and_get_scaler_state(trainer, checkpoint):
    """Resumes `trainer` from `checkpoint`; returns the state of its scaler right after the checkpoint was loaded."""
    restored = []
    trainer.add_callback(OnTrainBegin(lambda: restored.append(trainer.accelerator.scaler.state_dict())))
    trainer.train(resume_from_checkpoint=checkpoint)
    (state,) = restored
    return state


def directory_digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(path).iterdir()) if p.is_file()}


class TrainerResumeFp16CheckpointTest(TestCasePlus):
    def setUp(self):
        super().setUp()
        self.output_dir = self.get_auto_remove_tmp_dir()
        get_fp16_trainer(self.output_dir, max_steps=6).train()
        self.checkpoint = os.path.join(self.output_dir, "checkpoint-5")

    @parameterized.expand([("bf16",), ("fp32",)])
    @run_test_in_fresh_process(num_threads=1)
    def test_resume_fp16_checkpoint_under_other_precision(self, precision):
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), precision=precision, max_steps=6)
        with LoggingLevel(logging.INFO), CaptureLogger(logging.get_logger("transformers.trainer_loss_scale")) as cl:
            trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(trainer.state.global_step, 6)
        message = f"Not restoring the loss scale saved in {os.path.join(self.checkpoint, 'scaler.pt')}"
        self.assertEqual(cl.out.count(message), 1)

    @parameterized.expand([("deleted",), ("saved_by_disabled_scaler",), ("bf16_checkpoint",)])
    @run_test_in_fresh_process(num_threads=1)
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

    @run_test_in_fresh_process(num_threads=1)
    def test_resume_checkpoint_with_invalid_scaler_file(self):
        scaler_file = os.path.join(self.checkpoint, "scaler.pt")
        with open(scaler_file, "r+b") as f:
            f.truncate(os.path.getsize(scaler_file) // 2)
        digest = directory_digest(self.checkpoint)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        with self.assertRaisesRegex(ValueError, f"Cannot restore the loss scaler from {scaler_file}.*Delete"):
            trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(directory_digest(self.checkpoint), digest)

    @run_test_in_fresh_process(num_threads=1)
    def test_resume_checkpoint_with_scale_beyond_float32(self):
        # Without validation, training would fail at its first step inside torch, naming no file.
        scaler_file = os.path.join(self.checkpoint, "scaler.pt")
        torch.save(torch.load(scaler_file, weights_only=True) | {"scale": 1e308}, scaler_file)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir())
        with self.assertRaisesRegex(
            ValueError, f"Cannot restore the loss scaler from {scaler_file}: 'scale' is 1e\\+308"
        ):
            trainer.train(resume_from_checkpoint=self.checkpoint)
        self.assertEqual(trainer.state.global_step, 5)

    @run_test_in_fresh_process(num_threads=1)
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

    @run_test_in_fresh_process(num_threads=1)
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

    @run_test_in_fresh_process(num_threads=1)
    def test_resume_checkpoint_without_optimizer_files(self):
        # A checkpoint that kept its loss scale but lost its optimizer and scheduler files still resumes, and the
        # loss scale is restored.
        for name in ("optimizer.pt", "scheduler.pt"):
            os.remove(os.path.join(self.checkpoint, name))
        saved = torch.load(os.path.join(self.checkpoint, "scaler.pt"), weights_only=True)
        trainer = get_fp16_trainer(self.get_auto_remove_tmp_dir(), max_steps=6)
        self.assertEqual(resume_and_get_scaler_state(trainer, self.checkpoint), saved)
        self.assertEqual(trainer.state.global_step, 6)


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
            (
                "scale_above_float32_max",
                lambda valid: valid | {"scale": 1e308},
                "'scale' is 1e+308, larger than the float32 maximum 3.4028234663852886e+38",
            ),
            ("growth_factor_one", lambda valid: valid | {"growth_factor": 1.0}, "'growth_factor' is 1.0"),
            ("backoff_factor_one", lambda valid: valid | {"backoff_factor": 1.0}, "expected a number > 0 and < 1"),
            ("string_scale", lambda valid: valid | {"scale": "65536"}, "'scale' is '65536'"),
            ("float_interval", lambda valid: valid | {"growth_interval": 2.5}, "'growth_interval' is 2.5"),
            ("negative_tracker", lambda valid: valid | {"_growth_tracker": -1}, "expected an integer >= 0"),
            (
                "tracker_above_int32_max",
                lambda valid: valid | {"_growth_tracker": 2**31},
                "'_growth_tracker' is 2147483648, larger than the int32 maximum",
            ),
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

    def test_largest_float32_scale_is_valid(self):
        largest = torch.finfo(torch.float32).max
        self.save(self.valid | {"scale": largest})
        scaler = torch.amp.GradScaler("cpu")
        load_scaler_state(scaler, os.path.dirname(self.path))
        self.assertEqual(scaler.get_scale(), largest)

    def test_directory_is_not_a_missing_file(self):
        os.mkdir(self.path)
        with self.assertRaises(ValueError) as context:
            load_scaler_state(torch.amp.GradScaler("cpu"), os.path.dirname(self.path))
        self.assertEqual(
            str(context.exception),
            f"Cannot restore the loss scaler from {self.path}: it is a directory, not a file saved by `Trainer`. "
            f"Remove {self.path} to resume with the loss scale restarted at its initial value (the first updates may "
            "then be skipped while it recalibrates).",
        )
        self.assertTrue(os.path.isdir(self.path))

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
