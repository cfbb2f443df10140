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
from unittest import mock

from parameterized import parameterized

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.testing_utils import CaptureLogger, LoggingLevel, TestCasePlus, require_torch
from transformers.utils import is_torch_available, logging


if is_torch_available():
    import torch

    from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback


def original_sigterm_handler(signum, frame):
    pass


class RecordSigtermHandler(TrainerCallback):
    """Records the SIGTERM handler at each step, and raises `exception` there if given."""

    def __init__(self, exception=None):
        self.handlers, self.exception = [], exception

    def on_step_end(self, args, state, control, **kwargs):
        self.handlers.append(signal.getsignal(signal.SIGTERM))
        if self.exception is not None:
            raise self.exception


class CallAtStepEnd(TrainerCallback):
    """Calls `function` at the end of the first training step numbered `step`."""

    def __init__(self, step, function):
        self.step, self.function = step, function

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.step = None
            self.function()


@require_torch
class JITCheckpointSignalTest(TestCasePlus):
    def setUp(self):
        super().setUp()
        self.addCleanup(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, original_sigterm_handler))

    def get_trainer(self, callbacks=None, enable_jit_checkpoint=True, output_dir=None, max_steps=2, **kwargs):
        config = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
        input_ids = torch.randint(0, 32, (8, 8), generator=torch.Generator().manual_seed(0))
        args = TrainingArguments(
            output_dir or self.get_auto_remove_tmp_dir(),
            enable_jit_checkpoint=enable_jit_checkpoint,
            max_steps=max_steps,
            use_cpu=True,
            report_to=[],
            **kwargs,
        )
        train_dataset = [{"input_ids": ids, "labels": ids} for ids in input_ids]
        return Trainer(GPT2LMHeadModel(config), args, train_dataset=train_dataset, callbacks=callbacks)

    def get_callback(self, trainer):
        callback = JITCheckpointCallback()
        callback.set_trainer(trainer)
        return callback

    def assert_jit_handlers(self, handlers, count):
        self.assertEqual(len(handlers), count)
        self.assertTrue(all(isinstance(getattr(h, "__self__", None), CheckpointManager) for h in handlers))

    @parameterized.expand([(True,), (False,)])
    def test_sigterm_handler_while_training_twice(self, enable_jit_checkpoint):
        callback = RecordSigtermHandler()
        trainer = self.get_trainer([callback], enable_jit_checkpoint)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)
        for _ in range(2):
            # At transformers' default level (warning), installing and restoring the handler logs nothing
            with (
                LoggingLevel(logging.WARNING),
                CaptureLogger(logging.get_logger("transformers.trainer_jit_checkpoint")) as cl,
            ):
                trainer.train()
            self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)
            self.assertEqual(cl.out, "")
        if enable_jit_checkpoint:
            self.assert_jit_handlers(callback.handlers, 4)
        else:
            self.assertEqual(callback.handlers, [original_sigterm_handler] * 4)

    @parameterized.expand([("completes", None), ("raises", RuntimeError("training failed"))])
    def test_sigterm_handler_on_every_process(self, _, exception):
        # In a multi-process run each process gets SIGTERM and takes part in the checkpoint: not only the main one
        callback = RecordSigtermHandler(exception)
        with (
            mock.patch.object(TrainingArguments, "process_index", new_callable=mock.PropertyMock, return_value=1),
            mock.patch.object(
                TrainingArguments, "local_process_index", new_callable=mock.PropertyMock, return_value=1
            ),
        ):
            trainer = self.get_trainer([callback])
            self.assertFalse(trainer.is_local_process_zero())
            if exception is None:
                trainer.train()
            else:
                with self.assertRaises(type(exception)):
                    trainer.train()
        self.assert_jit_handlers(callback.handlers, 2 if exception is None else 1)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    def test_sigterm_handler_when_resuming_from_checkpoint(self):
        # The preemption case: the training resumed from a checkpoint is preemptible too
        output_dir = self.get_auto_remove_tmp_dir()
        self.get_trainer(output_dir=output_dir, save_steps=1).train()
        callback = RecordSigtermHandler()
        trainer = self.get_trainer([callback], output_dir=output_dir, max_steps=3)
        trainer.train(resume_from_checkpoint=f"{output_dir}/checkpoint-2")
        self.assert_jit_handlers(callback.handlers, 1)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    @parameterized.expand([("as_training_ends",), ("during_the_next_training",)])
    def test_late_sigterm_does_not_stop_the_next_training(self, fires):
        # SIGTERM in the last step: its timer (mocked, never started) requests a checkpoint as that training ends,
        # or would in the next training, unless cancelled
        trainer = self.get_trainer([CallAtStepEnd(2, lambda: signal.raise_signal(signal.SIGTERM))])
        with mock.patch("threading.Timer") as timer:
            trainer.train()
            request_checkpoint = timer.call_args.args[1]
            if fires == "as_training_ends":
                request_checkpoint()
            else:

                def fire():  # unless cancelled, as `threading.Timer` does
                    if not timer.return_value.cancel.called:
                        request_checkpoint()

                trainer.add_callback(CallAtStepEnd(1, fire))
            trainer.train()
        self.assertEqual(trainer.state.global_step, 2)

    @parameterized.expand([(True,), (False,)])
    def test_explicit_callback(self, enable_jit_checkpoint):
        # A `JITCheckpointCallback` passed by the user (never given the trainer) does nothing: the handler is the
        # Trainer's own callback's with `enable_jit_checkpoint`, and none without
        callback = RecordSigtermHandler()
        trainer = self.get_trainer([JITCheckpointCallback(), callback], enable_jit_checkpoint)
        trainer.train()
        if enable_jit_checkpoint:
            self.assert_jit_handlers(callback.handlers, 2)
        else:
            self.assertEqual(callback.handlers, [original_sigterm_handler] * 2)
        self.assertIs(signal.getsignal(signal.SIGTERM), original_sigterm_handler)

    @parameterized.expand([("error", RuntimeError("training failed")), ("interrupt", KeyboardInterrupt())])
    def test_failed_training_restores_sigterm_handler(self, _, exception):
        callback = RecordSigtermHandler(exception)
        trainer = self.get_trainer(callbacks=[callback])
        with self.assertRaises(type(exception)):
            trainer.train()
        self.assert_jit_handlers(callback.handlers, 1)
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
        callback.jit_manager.is_checkpoint_requested = True  # a SIGTERM came before the restart
        callback.on_train_begin(trainer.args, trainer.state, trainer.control)
        self.assertTrue(callback.jit_manager.is_checkpoint_requested)  # the restarted training still checkpoints
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
