"""The `loss_scale` log key of the trainer-log-loss-scale PR with DeepSpeed fp16 (its dynamic loss scaler, not the
GradScaler). Not part of the PR: DeepSpeed has no fp16 on most CPUs (it needs AVX512-FP16 or AMX-FP16), so upstream's
CPU CI could not run it; `make test` runs it with upstream's deepspeed spec and skips it, with the reason, elsewhere."""

import os
import sys

from transformers.integrations.deepspeed import unset_hf_deepspeed_config
from transformers.testing_utils import (
    TestCasePlus,
    get_torch_dist_unique_port,
    mockenv_context,
    require_deepspeed,
    require_torch,
)


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "trainer"))
# The module, not its TestCase class: pytest would collect the class again here
import test_trainer_loss_scale_logging as base  # noqa: E402


DIST_ENV_1_PROCESS = {"MASTER_ADDR": "localhost", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}


@require_torch
@require_deepspeed
class DeepSpeedLossScaleLoggingTest(TestCasePlus):
    get_trainer = base.TrainerLossScaleLoggingTest.get_trainer
    check_loss_scale_logs = base.TrainerLossScaleLoggingTest.check_loss_scale_logs

    def test_deepspeed_fp16_logs_loss_scale(self):
        from deepspeed.accelerator import get_accelerator

        self.addCleanup(unset_hf_deepspeed_config)
        if not get_accelerator().is_fp16_supported():
            self.skipTest(reason=f"DeepSpeed's {get_accelerator().device_name()} accelerator does not support fp16")
        # hysteresis=1: DeepSpeed halves the loss scale on the first overflow, as GradScaler does
        fp16 = {"enabled": "auto", "initial_scale_power": 10, "loss_scale_window": 1000, "hysteresis": 1}
        ds_config = {"fp16": fp16, "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}
        with mockenv_context(**DIST_ENV_1_PROCESS, MASTER_PORT=str(get_torch_dist_unique_port())):
            trainer, recorder = self.get_trainer(fp16=True, deepspeed=ds_config)
            trainer.train()
        self.check_loss_scale_logs(recorder, 2.0**10, trainer.deepspeed.optimizer.loss_scale)
