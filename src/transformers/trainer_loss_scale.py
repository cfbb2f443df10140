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
Restoring the loss scaler (`torch.amp.GradScaler`) of fp16 mixed precision training from a [`Trainer`] checkpoint.
"""

import math
import os
import pickle
import re

import torch

from .utils import check_torch_load_is_safe, logging


logger = logging.get_logger(__name__)

SCALER_NAME = "scaler.pt"

_SCALER_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


# `GradScaler` keeps its scale in a float32 tensor and its growth tracker in an int32 tensor.
_FLOAT32_MAX = torch.finfo(torch.float32).max
_INT32_MAX = torch.iinfo(torch.int32).max


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
    if state["scale"] > _FLOAT32_MAX:
        return f"'scale' is {state['scale']!r}, larger than the float32 maximum {_FLOAT32_MAX!r} the scaler can hold"
    for key, minimum in (("growth_interval", 1), ("_growth_tracker", 0)):
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            return f"{key!r} is {value!r}, expected an integer >= {minimum}"
    if state["_growth_tracker"] > _INT32_MAX:
        return f"'_growth_tracker' is {state['_growth_tracker']!r}, larger than the int32 maximum {_INT32_MAX}"
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
        `ValueError`: If `path` is a directory, or the file cannot be read weights-only or does not hold a valid
        `GradScaler` state.
    """
    if os.path.isdir(path):
        raise ValueError(
            f"Cannot restore the loss scaler from {path}: it is a directory, not a file saved by `Trainer`. Remove "
            f"{path} to resume with the loss scale restarted at its initial value (the first updates may then be "
            "skipped while it recalibrates)."
        )
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
    # `exists`, not `isfile`: a directory in the way is an error (see `read_scaler_state`), not a missing file.
    has_saved_state = os.path.exists(path)
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
