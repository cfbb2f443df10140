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

import os
from unittest import mock

from parameterized import parameterized

from transformers import Trainer, TrainingArguments
from transformers.testing_utils import CaptureLogger, LoggingLevel, TestCasePlus, require_torch
from transformers.utils import is_torch_available, logging


if is_torch_available():
    import torch


@require_torch
class TrainerLoadScalerTest(TestCasePlus):
    def get_trainer(self, scaler=None, **kwargs):
        args = TrainingArguments(self.get_auto_remove_tmp_dir(), use_cpu=True, report_to=[], **kwargs)
        trainer = Trainer(torch.nn.Linear(2, 2), args)
        if scaler is not None:  # Accelerate creates no loss scaler for fp16 on CPU
            trainer.accelerator.scaler = scaler
        return trainer

    def load_scaler(self, trainer, checkpoint):
        with LoggingLevel(logging.INFO), CaptureLogger(logging.get_logger("transformers.trainer")) as cl:
            trainer._load_scaler(checkpoint)
        return cl.out

    @parameterized.expand([("fp32", {}), ("bf16", {"bf16": True}), ("disabled_scaler", {"fp16": True}, False)])
    def test_fp16_checkpoint_resumed_without_loss_scaling(self, _, precision, scaler_enabled=None):
        checkpoint = self.get_auto_remove_tmp_dir()
        torch.save(torch.amp.GradScaler("cpu", init_scale=256.0).state_dict(), os.path.join(checkpoint, "scaler.pt"))
        scaler = None if scaler_enabled is None else torch.amp.GradScaler("cpu", enabled=scaler_enabled)
        trainer = self.get_trainer(scaler, **precision)

        self.assertIn(f"Not loading scaler.pt from {checkpoint}", self.load_scaler(trainer, checkpoint))

    def test_fp16_resumed_from_checkpoint_with_scaler_state(self):
        checkpoint = self.get_auto_remove_tmp_dir()
        torch.save(torch.amp.GradScaler("cpu", init_scale=256.0).state_dict(), os.path.join(checkpoint, "scaler.pt"))
        trainer = self.get_trainer(torch.amp.GradScaler("cpu"), fp16=True)

        out = self.load_scaler(trainer, checkpoint)
        self.assertEqual(trainer.accelerator.scaler.get_scale(), 256.0)
        self.assertNotIn("scaler.pt", out)

    def test_fp16_resumed_from_checkpoint_without_scaler_state(self):
        checkpoint = self.get_auto_remove_tmp_dir()  # e.g. saved before #34932
        trainer = self.get_trainer(torch.amp.GradScaler("cpu"), fp16=True)

        self.assertIn(
            f"No scaler.pt in {checkpoint}: the fp16 loss scale restarts at 65536.0, and the first updates may be skipped",
            self.load_scaler(trainer, checkpoint),
        )
        # Once, from the main process
        with mock.patch.object(trainer, "is_world_process_zero", return_value=False):
            self.assertNotIn("scaler.pt", self.load_scaler(trainer, checkpoint))
