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
"""`enable_jit_checkpoint` handles SIGTERM only while `Trainer.train` runs, and gives back the original handler."""

import signal

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, is_torch_available
from transformers.testing_utils import TestCasePlus, require_torch


if is_torch_available():
    import torch

    from transformers.trainer_jit_checkpoint import CheckpointManager


def original_sigterm_handler(signum, frame):
    pass


class TrainingFailed(Exception):
    pass


class SigtermHandlerCallback(TrainerCallback):
    def __init__(self, raise_at_step=None):
        self.handlers = []
        self.raise_at_step = raise_at_step

    def on_step_end(self, args, state, control, **kwargs):
        self.handlers.append(signal.getsignal(signal.SIGTERM))
        if state.global_step == self.raise_at_step:
            raise TrainingFailed()


@require_torch
class JITCheckpointSignalHandlerTest(TestCasePlus):
    def setUp(self):
        super().setUp()
        # Start every test from a known handler, and leave the process as it was even if the test fails
        self.addCleanup(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, original_sigterm_handler))

    def get_trainer(self, callback=None):
        config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
        input_ids = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))
        train_dataset = [{"input_ids": ids, "labels": ids} for ids in input_ids]
        args = TrainingArguments(
            self.get_auto_remove_tmp_dir(),
            enable_jit_checkpoint=True,
            per_device_train_batch_size=2,
            max_steps=5,
            save_strategy="no",
            report_to="none",
        )
        callbacks = None if callback is None else [callback]
        return Trainer(GPT2LMHeadModel(config), args, train_dataset=train_dataset, callbacks=callbacks)

    def test_init_keeps_sigterm_handler(self):
        self.get_trainer()
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_train_handles_sigterm_then_restores_handler(self):
        callback = SigtermHandlerCallback()
        self.get_trainer(callback).train()
        self.assertEqual(len(callback.handlers), 5)
        for handler in callback.handlers:
            self.assertIsInstance(getattr(handler, "__self__", None), CheckpointManager)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_failed_train_restores_handler(self):
        callback = SigtermHandlerCallback(raise_at_step=2)
        with self.assertRaises(TrainingFailed):
            self.get_trainer(callback).train()
        self.assertIsInstance(getattr(callback.handlers[-1], "__self__", None), CheckpointManager)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_setup_and_restore_are_idempotent(self):
        manager = CheckpointManager(trainer=None)
        # A restarted training loop (`auto_find_batch_size`) sets the handler up again: the original is kept
        manager.setup_signal_handler()
        manager.setup_signal_handler()
        manager.restore_signal_handler()
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)
        # Restoring again does not replace a handler installed after training
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        manager.restore_signal_handler()
        self.assertIs(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)
