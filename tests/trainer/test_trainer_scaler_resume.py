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

import hashlib
import math
import os
import random
import shutil
import tempfile
import traceback
from pathlib import Path
from unittest import mock

from parameterized import parameterized

from transformers import LlamaConfig, TrainingArguments, is_torch_available
from transformers.testing_utils import TestCasePlus, require_torch


if is_torch_available():
    import torch

    from transformers import LlamaForCausalLM, Trainer


UNPICKLED = []


def record_unpickling():
    UNPICKLED.append(True)


class ForbiddenGlobal:
    # Unpickling this calls a global that a weights-only load must refuse to call.
    def __reduce__(self):
        return (record_unpickling, ())


def get_trainer(output_dir, precision, max_steps=4):
    torch.manual_seed(42)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    train_dataset = [
        {"input_ids": torch.randint(0, 32, (8,)), "labels": torch.randint(0, 32, (8,))} for _ in range(16)
    ]
    args = TrainingArguments(
        output_dir,
        use_cpu=True,
        fp16=precision.startswith("fp16"),
        bf16=precision == "bf16",
        max_steps=max_steps,
        save_steps=4,
        per_device_train_batch_size=2,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(LlamaForCausalLM(config), args, train_dataset=train_dataset)
    if precision.startswith("fp16"):
        # Accelerate only creates a loss scaler for fp16 on an accelerator: give this CPU run the one fp16 would use.
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    return trainer


def hash_files(folder):
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in Path(folder).iterdir()}


def write_bytes(path, transform):
    Path(path).write_bytes(transform(Path(path).read_bytes()))


def replace_state(path, transform):
    torch.save(transform(torch.load(path, weights_only=True)), path)


@require_torch
class TrainerScalerResumeTest(TestCasePlus):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp_dir = tempfile.mkdtemp()
        get_trainer(cls.tmp_dir, "fp16").train()
        cls.saved_checkpoint = os.path.join(cls.tmp_dir, "checkpoint-4")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp_dir, ignore_errors=True)
        super().tearDownClass()

    def get_checkpoint(self):
        output_dir = self.get_auto_remove_tmp_dir()
        checkpoint = os.path.join(output_dir, "checkpoint-4")
        shutil.copytree(self.saved_checkpoint, checkpoint)
        return output_dir, checkpoint

    @parameterized.expand([("bf16",), ("fp32",), ("fp16_disabled_scaler",)])
    def test_resume_fp16_checkpoint_without_loss_scaling(self, precision):
        output_dir, checkpoint = self.get_checkpoint()
        trainer = get_trainer(output_dir, precision, max_steps=6)
        with self.assertLogs("transformers.trainer", level="INFO") as logs:
            trainer.train(resume_from_checkpoint=checkpoint)
        self.assertEqual(trainer.state.global_step, 6)
        records = [record for record in logs.records if "scaler.pt" in record.getMessage()]
        self.assertEqual([record.levelname for record in records], ["INFO"])
        self.assertIn(os.path.join(checkpoint, "scaler.pt"), records[0].getMessage())
        self.assertIn("this run does not use fp16 loss scaling", records[0].getMessage())

    @parameterized.expand([("missing",), ("empty",)])
    def test_resume_without_scaler_state_warns(self, case):
        output_dir, checkpoint = self.get_checkpoint()
        scaler_file = os.path.join(checkpoint, "scaler.pt")
        if case == "missing":
            os.remove(scaler_file)
        else:
            torch.save({}, scaler_file)
        trainer = get_trainer(output_dir, "fp16")
        initial_scale = trainer.accelerator.scaler.get_scale()
        with self.assertLogs("transformers.trainer", level="WARNING") as logs:
            trainer._load_scaler(checkpoint)
        self.assertEqual(trainer.accelerator.scaler.get_scale(), initial_scale)
        records = [record for record in logs.records if checkpoint in record.getMessage()]
        self.assertEqual([record.levelname for record in records], ["WARNING"])
        self.assertIn(f"initial value {initial_scale}", records[0].getMessage())
        self.assertIn("will not exactly match an uninterrupted one", records[0].getMessage())

    def test_resume_restores_loss_scale(self):
        output_dir, checkpoint = self.get_checkpoint()
        scaler_file = os.path.join(checkpoint, "scaler.pt")
        self.assertEqual(torch.load(scaler_file, weights_only=True)["scale"], 2.0**16)
        # A scale that differs from the initial one, and that two more finite fp32 steps leave unchanged.
        replace_state(scaler_file, lambda state: {**state, "scale": 1024.0})
        trainer = get_trainer(output_dir, "fp16", max_steps=6)
        self.assertEqual(trainer.accelerator.scaler.get_scale(), 2.0**16)
        trainer.train(resume_from_checkpoint=checkpoint)
        self.assertEqual(trainer.state.global_step, 6)
        self.assertEqual(trainer.accelerator.scaler.get_scale(), 1024.0)
        self.assertEqual(trainer.accelerator.scaler.state_dict()["scale"], 1024.0)

    @parameterized.expand(
        [
            ("random_bytes", lambda path: write_bytes(path, lambda data: random.Random(0).randbytes(len(data)))),
            ("truncated", lambda path: write_bytes(path, lambda data: data[: len(data) // 2])),
            ("forbidden_global", lambda path: replace_state(path, lambda state: {**state, "x": ForbiddenGlobal()})),
            ("not_a_dict", lambda path: replace_state(path, lambda state: list(state.values()))),
            ("scale_inf", lambda path: replace_state(path, lambda state: {**state, "scale": math.inf})),
            ("scale_nan", lambda path: replace_state(path, lambda state: {**state, "scale": math.nan})),
            ("scale_zero", lambda path: replace_state(path, lambda state: {**state, "scale": 0.0})),
            ("scale_above_float32_max", lambda path: replace_state(path, lambda state: {**state, "scale": 1e39})),
            ("scale_not_a_number", lambda path: replace_state(path, lambda state: {**state, "scale": "1024"})),
            ("missing_keys", lambda path: replace_state(path, lambda state: {"scale": state["scale"]})),
        ]
    )
    def test_resume_invalid_scaler_state_raises(self, name, corrupt):
        # `_load_scaler` itself; `test_resume_invalid_scaler_state_stops_training` checks that `train()` raises it.
        output_dir, checkpoint = self.get_checkpoint()
        scaler_file = os.path.join(checkpoint, "scaler.pt")
        corrupt(scaler_file)
        files_before = hash_files(checkpoint)
        trainer = get_trainer(output_dir, "fp16")
        with self.assertRaises(ValueError) as context:
            trainer._load_scaler(checkpoint)
        message = str(context.exception)
        self.assertIn(scaler_file, message)
        self.assertIn("Delete this file", message)
        self.assertNotIn("weights_only=False", "".join(traceback.format_exception(context.exception)))
        self.assertEqual(hash_files(checkpoint), files_before)
        self.assertEqual(UNPICKLED, [])

    def test_resume_invalid_scaler_state_stops_training(self):
        output_dir, checkpoint = self.get_checkpoint()
        write_bytes(os.path.join(checkpoint, "scaler.pt"), lambda data: data[: len(data) // 2])
        trainer = get_trainer(output_dir, "fp16", max_steps=6)
        with mock.patch.object(trainer, "training_step") as training_step:
            with self.assertRaisesRegex(ValueError, "Delete this file"):
                trainer.train(resume_from_checkpoint=checkpoint)
        training_step.assert_not_called()

    def test_resume_unreadable_scaler_file_raises_os_error(self):
        output_dir, checkpoint = self.get_checkpoint()
        os.remove(os.path.join(checkpoint, "scaler.pt"))
        os.mkdir(os.path.join(checkpoint, "scaler.pt"))
        trainer = get_trainer(output_dir, "fp16")
        with self.assertRaises(OSError):
            trainer._load_scaler(checkpoint)
