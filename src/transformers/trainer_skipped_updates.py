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
Optimizer updates skipped by fp16 loss scaling (`torch.amp.GradScaler`) in the [`Trainer`]: deciding whether an update
was applied, counting the skipped ones and reporting the loss scale.
"""

from .utils import is_accelerate_available, logging


logger = logging.get_logger(__name__)

# Warn each time this many optimizer updates in a row have been skipped because of overflowing gradients.
CONSECUTIVE_SKIPPED_UPDATES_WARNING_INTERVAL = 10

# First Accelerate release whose `optimizer_step_was_skipped` also reports the updates that AMP-aware optimizers
# (`_step_supports_amp_scaling`, e.g. `adamw_torch_fused`) skip themselves (huggingface/accelerate#4242). With older
# releases the monitor falls back to its own detection for those optimizers.
ACCELERATE_MIN_VERSION_REPORTING_AMP_AWARE_SKIPS = "1.16.0"


def get_num_skipped_updates(state) -> int:
    """
    Returns the number of optimizer updates skipped since the beginning of training because the gradients overflowed
    in fp16 mixed precision training.

    The count is kept in `state.stateful_callbacks` under the name of [`SkippedUpdatesMonitor`], where versions of
    Transformers that do not know it load it without error and ignore it, rather than in a new `TrainerState` field,
    which they would refuse to load.

    Args:
        state ([`TrainerState`]):
            The state of the [`Trainer`], for instance `trainer.state`.

    Raises:
        `ValueError`: If the saved count is not a non-negative integer (a hand-edited `trainer_state.json`).
    """
    name = SkippedUpdatesMonitor.__name__
    entry = (state.stateful_callbacks or {}).get(name)
    if entry is None:
        return 0
    count = entry.get("attributes", {}).get("num_skipped_updates") if isinstance(entry, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(
            f"The entry {name!r} of `stateful_callbacks` in the trainer state is {entry!r}, expected "
            "{'args': {}, 'attributes': {'num_skipped_updates': <an integer >= 0>}}. Fix or delete it in the "
            "`trainer_state.json` of the checkpoint to resume from; without it, the count restarts at 0."
        )
    return count


def _set_num_skipped_updates(state, value: int) -> None:
    if state.stateful_callbacks is None:
        state.stateful_callbacks = {}
    # The layout of `ExportableState.state()`, like the other entries of `stateful_callbacks`.
    state.stateful_callbacks[SkippedUpdatesMonitor.__name__] = {
        "args": {},
        "attributes": {"num_skipped_updates": value},
    }


class SkippedUpdatesMonitor:
    """
    Decides whether each optimizer step of the [`Trainer`] applied its update or skipped it because the fp16 gradients
    overflowed, counts the skipped updates, and reports the loss scale.

    The decision comes from `accelerator.optimizer_step_was_skipped`. Accelerate releases older than
    `ACCELERATE_MIN_VERSION_REPORTING_AMP_AWARE_SKIPS` only see a skip when the `GradScaler` did not call the
    optimizer's `step()`; AMP-aware optimizers (`adamw_torch_fused`, the default) are always called and skip the update
    themselves. For those optimizers only, with those Accelerate releases only, the monitor falls back to reading the
    scaler: `GradScaler.update()` resets its growth tracker to 0 and multiplies the scale by `backoff_factor` (< 1)
    after a skipped update; after an applied one it counts the tracker up, or resets it and multiplies the scale by
    `growth_factor` (> 1). So an update was skipped exactly when the tracker is 0 and the scale did not grow, which
    still holds once the scale has underflowed to 0. Remove the fallback once the minimum Accelerate version has the
    fix.

    Args:
        accelerator (`accelerate.Accelerator`):
            The accelerator of the [`Trainer`]; its `scaler`, if enabled, is the one monitored.
        optimizer (`torch.optim.Optimizer`, *optional*):
            The optimizer of the run, as prepared by the accelerator. Only needed to decide whether to read the scaler.
    """

    def __init__(self, accelerator, optimizer=None):
        self.accelerator = accelerator
        scaler = accelerator.scaler
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.consecutive_skipped_updates = 0
        # The loss scale before the next optimizer step, when the fallback detection is needed.
        self._scale_before_step = None
        if self.scaler is not None and _accelerate_misses_skips_of(optimizer):
            # Synchronizes once: the scale is created lazily at the first backward pass.
            self._scale_before_step = self.scaler.get_scale()

    def optimizer_step_was_skipped(self, state) -> bool:
        """
        Returns whether the optimizer step that just ran skipped its update, and counts it in `state`. Call it once
        after each optimizer step.
        """
        skipped = self.accelerator.optimizer_step_was_skipped
        if self._scale_before_step is not None:
            scale = self.scaler._scale
            if not skipped:
                skipped = bool((self.scaler._growth_tracker == 0) & (scale <= self._scale_before_step))
            # Kept on device: reading it would synchronize.
            self._scale_before_step = scale.detach().clone()
        if not skipped:
            self.consecutive_skipped_updates = 0
            return False
        _set_num_skipped_updates(state, get_num_skipped_updates(state) + 1)
        self.consecutive_skipped_updates += 1
        if self.consecutive_skipped_updates % CONSECUTIVE_SKIPPED_UPDATES_WARNING_INTERVAL == 0:
            scale = f" (loss scale now {self.scaler.get_scale()})" if self.scaler is not None else ""
            logger.warning(
                f"The last {self.consecutive_skipped_updates} optimizer updates were all skipped because the "
                f"gradients overflowed{scale}; the learning rate schedule does not advance on skipped updates. "
                "If this goes on, the loss or gradients are likely inf/NaN: check `loss` and `grad_norm` in the logs."
            )
        return True

    def log_values(self, state) -> dict[str, float]:
        """Returns the loss scale and the number of skipped updates to log, or nothing without a scaler."""
        if self.scaler is None:
            return {}
        return {"loss_scale": self.scaler.get_scale(), "num_skipped_updates": get_num_skipped_updates(state)}


def _accelerate_misses_skips_of(optimizer) -> bool:
    """Whether `accelerator.optimizer_step_was_skipped` misses the updates that `optimizer` skips by itself."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # unwrap `AcceleratedOptimizer`
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return False
    return not is_accelerate_available(ACCELERATE_MIN_VERSION_REPORTING_AMP_AWARE_SKIPS)
