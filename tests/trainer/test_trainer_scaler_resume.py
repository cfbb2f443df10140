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

from parameterized import parameterized

from transformers import Trainer, TrainingArguments
from transformers.testing_utils import CaptureLogger, LoggingLevel, TestCasePlus, require_torch
from transformers.utils import is_torch_available, logging


if is_torch_available():
    import torch


@require_torch
class TrainerLoadScalerTest(TestCasePlus):
    def get_trainer(self, **kwargs):
        args = TrainingArguments(self.get_auto_remove_tmp_dir(), use_cpu=True, report_to=[], **kwargs)
        return Trainer(torch.nn.Linear(2, 2), args)

    @parameterized.expand([("fp32", {}), ("bf16", {"bf16": True})])
    def test_fp16_checkpoint_resumed_without_loss_scaling(self, _, precision):
        checkpoint = self.get_auto_remove_tmp_dir()
        torch.save(torch.amp.GradScaler("cpu").state_dict(), os.path.join(checkpoint, "scaler.pt"))
        trainer = self.get_trainer(**precision)
        self.assertIsNone(trainer.accelerator.scaler)

        with LoggingLevel(logging.INFO), CaptureLogger(logging.get_logger("transformers.trainer")) as cl:
            trainer._load_scaler(checkpoint)
        self.assertIn(f"Not loading scaler.pt from {checkpoint}", cl.out)

    def test_fp16_resumed_from_checkpoint_without_scaler_state(self):
        checkpoint = self.get_auto_remove_tmp_dir()  # e.g. saved before #34932
        trainer = self.get_trainer(fp16=True)
        # Accelerate creates no loss scaler for fp16 on CPU
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu")

        with CaptureLogger(logging.get_logger("transformers.trainer")) as cl:
            trainer._load_scaler(checkpoint)
        self.assertIn(
            f"No scaler.pt in {checkpoint}: the fp16 loss scale restarts at 65536.0, and the first updates may be skipped",
            cl.out,
        )
