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
Loss scaling (`torch.amp.GradScaler`) support for the [`Trainer`]: restoring the scaler from a checkpoint, detecting
optimizer updates skipped because of overflowing gradients, and reporting the loss scale.
"""

import math
import os
import pickle
import re

import torch

from .utils import check_torch_load_is_safe, logging


logger = logging.get_logger(__name__)

SCALER_NAME = "scaler.pt"

# Warn each time this many optimizer updates in a row have been skipped because of overflowing gradients.
CONSECUTIVE_SKIPPED_UPDATES_WARNING_INTERVAL = 10

_SCALER_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _weights_only_refusal_reason(error: pickle.UnpicklingError) -> str:
    """Returns the part of a weights-only load error that says what the file holds, without torch's advice."""
    # Keep the first sentence of the line that names the refused object, e.g. "Unsupported global: GLOBAL os.system
    # was not an allowed global by default"; torch's advice on how to allow it is left out on purpose.
    match = re.search(r"(?:Unsupported|Trying to load unsupported) .*?(?=\.\s|\.?$)", str(error), re.MULTILINE)
    return match.group(0) if match else "unsupported content"


def _scaler_state_problem(state) -> str | None:
    """Returns what is wrong with a loaded scaler state, or `None` if it can be loaded."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dict"
    missing = [key for key in _SCALER_STATE_KEYS if key not in state]
    if missing:
        return f"it misses the key(s) {', '.join(repr(key) for key in missing)}"
    # The bounds the `GradScaler` constructor enforces, plus a finite positive scale.
    for key, low, high, expected in (
        ("scale", 0, math.inf, "a finite positive number"),
        ("growth_factor", 1, math.inf, "a finite number > 1"),
        ("backoff_factor", 0, 1, "a number > 0 and < 1"),
    ):
        value = state[key]
        if key == "scale" and value == 0:
            return (
                "'scale' is 0.0: the loss scale underflowed because the gradients overflowed for many updates in a row"
            )
        if not _is_number(value) or not low < value < high:
            return f"{key!r} is {value!r}, expected {expected}"
    for key, minimum in (("growth_interval", 1), ("_growth_tracker", 0)):
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            return f"{key!r} is {value!r}, expected an integer >= {minimum}"
    return None


def read_scaler_state(path: str) -> dict:
    """
    Reads and validates the loss scaler state saved by [`Trainer`] at `path`.

    The file is loaded with `weights_only=True` and is never modified.

    Args:
        path (`str`):
            Path to a `scaler.pt` file.

    Returns:
        `dict`: The state, ready for `GradScaler.load_state_dict`. It is empty when the file was saved from a
        disabled `GradScaler`.

    Raises:
        `ValueError`: If the file cannot be read weights-only or does not hold a valid `GradScaler` state.
    """
    check_torch_load_is_safe()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise  # the file could not be read (permissions, I/O): nothing says it is invalid
    except pickle.UnpicklingError as error:
        problem = (
            f"the weights-only loader refused it ({_weights_only_refusal_reason(error)}): it is corrupt, or holds "
            "Python objects where only numbers are expected"
        )
    except Exception as error:
        reason = re.split(r"\.\s", str(error).strip())[0]
        reason = reason or ("unexpected end of file" if isinstance(error, EOFError) else "no details given")
        problem = f"it is not a readable torch file, it may be truncated or corrupt ({type(error).__name__}: {reason})"
    else:
        # A disabled `GradScaler` saves an empty state, which is valid: there is no loss scale to restore.
        problem = None if state == {} else _scaler_state_problem(state)
    if problem is not None:
        raise ValueError(
            f"Cannot restore the loss scaler from {path}: {problem}. Delete {path} to resume with the loss scale "
            "restarted at its initial value (the first updates may then be skipped while it recalibrates)."
        )
    return state


def load_scaler_state(scaler: "torch.amp.GradScaler | None", checkpoint: str) -> None:
    """
    Restores `scaler` from the `scaler.pt` file of `checkpoint`, handling precision changes across a resume.

    - If this run has no enabled scaler (bf16, fp32, DeepSpeed), a saved loss scale is not used, and that is said
      once at info level.
    - If this run has a scaler but the checkpoint holds no loss scale (a checkpoint saved without a scaler or by
      an older version), training resumes from the scaler's initial scale, with a warning.

    Args:
        scaler (`torch.amp.GradScaler`, *optional*):
            The scaler of this run, usually `accelerator.scaler`.
        checkpoint (`str`):
            The checkpoint folder training resumes from.

    Raises:
        `ValueError`: If the checkpoint's `scaler.pt` is invalid (see [`read_scaler_state`]).
    """
    path = os.path.join(checkpoint, SCALER_NAME)
    has_saved_state = os.path.isfile(path)
    if scaler is None or not scaler.is_enabled():
        if has_saved_state:
            logger.info(
                f"Not restoring the loss scale saved in {path}: this run does not use fp16 loss scaling (it trains in"
                " bf16 or fp32, or DeepSpeed manages its own loss scaler)."
            )
        return
    state = read_scaler_state(path) if has_saved_state else {}
    if not state:
        logger.warning(
            f"The checkpoint {checkpoint} has no saved loss scale, so the fp16 loss scale restarts at its initial "
            f"value {scaler.get_scale()}. The first optimizer updates may be skipped while the scale recalibrates, "
            "so this run will not exactly match an uninterrupted one."
        )
        return
    scaler.load_state_dict(state)


class LossScaleMonitor:
    """
    Tracks the optimizer updates skipped by a `GradScaler` because of overflowing gradients.

    `GradScaler.update()` resets its growth tracker to 0 and multiplies the scale by `backoff_factor` (< 1) after a
    skipped update; after an applied one, it counts the tracker up, or resets it to 0 and multiplies the scale by
    `growth_factor` (> 1). So an update was skipped exactly when the tracker is 0 and the scale did not grow. This holds
    for every optimizer, including fused ones (`adamw_torch_fused`) that receive the overflow flag and skip the update
    themselves, which `accelerator.optimizer_step_was_skipped` does not see, and still holds once the scale has
    underflowed to 0.

    Args:
        scaler (`torch.amp.GradScaler`, *optional*):
            The scaler of this run. Without an enabled scaler, only the skips reported by the accelerator count.
    """

    def __init__(self, scaler: "torch.amp.GradScaler | None"):
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.consecutive_skipped_updates = 0
        self._scale_before_step = None

    def before_optimizer_step(self) -> None:
        """Records the loss scale before the optimizer step, on device, without synchronizing."""
        if self.scaler is not None and self.scaler._scale is not None:
            self._scale_before_step = self.scaler._scale.detach().clone()

    def optimizer_step_was_skipped(self, state, accelerator_step_was_skipped: bool) -> bool:
        """
        Returns whether the optimizer step that just ran skipped its update, and counts it in
        `state.num_skipped_updates`. Reads the scaler only when the accelerator did not already report the skip.
        """
        skipped = accelerator_step_was_skipped
        if not skipped and self._scale_before_step is not None:
            skipped = bool((self.scaler._growth_tracker == 0) & (self.scaler._scale <= self._scale_before_step))
        self._scale_before_step = None
        if not skipped:
            self.consecutive_skipped_updates = 0
            return False
        state.num_skipped_updates += 1
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
        return {"loss_scale": self.scaler.get_scale(), "num_skipped_updates": state.num_skipped_updates}
