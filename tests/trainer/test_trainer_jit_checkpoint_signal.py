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

import signal

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.testing_utils import TestCasePlus, require_torch
from transformers.utils import is_torch_available


if is_torch_available():
    import torch

    from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback


def original_sigterm_handler(signum, frame):
    pass


class FailingCallback(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        self.handler_during_training = signal.getsignal(signal.SIGTERM)
        raise RuntimeError("training failed")


@require_torch
class JITCheckpointSignalTest(TestCasePlus):
    def setUp(self):
        super().setUp()
        self.addCleanup(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, original_sigterm_handler))

    def get_trainer(self, callbacks=None):
        config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
        input_ids = torch.randint(0, 32, (8, 8), generator=torch.Generator().manual_seed(0))
        args = TrainingArguments(
            self.get_auto_remove_tmp_dir(), enable_jit_checkpoint=True, max_steps=2, use_cpu=True, report_to=[]
        )
        train_dataset = [{"input_ids": ids, "labels": ids} for ids in input_ids]
        return Trainer(GPT2LMHeadModel(config), args, train_dataset=train_dataset, callbacks=callbacks)

    def get_callback(self, trainer):
        callback = JITCheckpointCallback()
        callback.set_trainer(trainer)
        return callback

    def test_init_and_set_trainer_keep_sigterm_handler(self):
        self.get_callback(self.get_trainer())
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_failed_training_restores_sigterm_handler(self):
        callback = FailingCallback()
        trainer = self.get_trainer(callbacks=[callback])
        with self.assertRaisesRegex(RuntimeError, "training failed"):
            trainer.train()
        self.assertIsInstance(getattr(callback.handler_during_training, "__self__", None), CheckpointManager)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_training_failing_before_train_begin_keeps_sigterm_handler(self):
        trainer = self.get_trainer()
        trainer.train_dataset = None
        with self.assertRaisesRegex(ValueError, "requires a train_dataset"):
            trainer.train()
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_second_train_begin_keeps_original_handler(self):
        # e.g. `auto_find_batch_size` restarting training after an out-of-memory error
        trainer = self.get_trainer()
        callback = self.get_callback(trainer)
        callback.on_train_begin(trainer.args, trainer.state, trainer.control)
        callback.on_train_begin(trainer.args, trainer.state, trainer.control)
        callback.on_train_end(trainer.args, trainer.state, trainer.control)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_on_train_end_restores_default_handler(self):
        trainer = self.get_trainer()
        callback = self.get_callback(trainer)
        callback.on_train_begin(trainer.args, trainer.state, trainer.control)
        # What `signal.signal` returns when the previous handler was not installed from Python
        callback.jit_manager._original_sigterm_handler = None
        callback.on_train_end(trainer.args, trainer.state, trainer.control)
        self.assertIs(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)
