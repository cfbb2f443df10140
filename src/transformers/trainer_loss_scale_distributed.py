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
fp16 loss scaling in distributed runs of the [`Trainer`].

- Each process has its own `GradScaler` and restores it from the `scaler.pt` file of the checkpoint it resumes from.
  DDP averages the scaled gradients of all processes, and each process then unscales the average with its own scale:
  if the scales differ, every process applies a different update and the model replicas silently drift apart.
  [`check_loss_scale_matches_across_processes`] turns that into an error.
- DeepSpeed keeps its own loss scaler inside its fp16 optimizer (and its state in DeepSpeed's checkpoints).
  [`deepspeed_loss_scale_log_values`] reports its scale under the names used for `GradScaler` runs.
"""

import os

import torch

from .trainer_skipped_updates import get_num_skipped_updates


_COMPARED_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def check_loss_scale_matches_across_processes(accelerator, checkpoint: str) -> None:
    """
    Raises the same error in every process if the processes restored different loss scaler states from `checkpoint`.

    This happens when the processes read different `scaler.pt` files, e.g. on nodes that each resume from their own
    copy of the checkpoint, one of them stale or without the file. Does nothing without an enabled scaler or with a
    single process.

    Args:
        accelerator (`accelerate.Accelerator`):
            The accelerator of the run; its `scaler` was just restored.
        checkpoint (`str`):
            The checkpoint folder this process resumed from.

    Raises:
        `ValueError`: If the restored scaler states differ between processes.
    """
    scaler = accelerator.scaler
    if accelerator.num_processes == 1 or scaler is None or not scaler.is_enabled():
        return
    state = scaler.state_dict()
    local = torch.tensor([[float(state[key]) for key in _COMPARED_KEYS]], device=accelerator.device)
    restored = accelerator.gather(local).cpu()
    if bool((restored == restored[0]).all()):
        return
    states = "; ".join(
        f"process {process}: " + ", ".join(f"{key.lstrip('_')} {value:g}" for key, value in zip(_COMPARED_KEYS, row))
        for process, row in enumerate(restored.tolist())
    )
    raise ValueError(
        f"The processes restored different loss scaler states from their checkpoint ({states}); this process read "
        f"{os.path.join(checkpoint, 'scaler.pt')}. Resuming would give each process different gradients and silently "
        "make their models diverge. Resume every process from the same checkpoint, with the same `scaler.pt` (the one "
        "the main process saved)."
    )


def deepspeed_loss_scale_log_values(model_wrapped, state) -> dict[str, float]:
    """
    Returns the loss scale of a DeepSpeed engine training in fp16 and the number of skipped updates, to log under the
    same names as with a `GradScaler` (`loss_scale`, `num_skipped_updates`), or nothing if the engine does not train in
    fp16.

    Args:
        model_wrapped (`deepspeed.DeepSpeedEngine`):
            The engine wrapping the model.
        state ([`TrainerState`]):
            The state of the [`Trainer`], which counts the skipped updates.
    """
    fp16_enabled = getattr(model_wrapped, "fp16_enabled", None)
    loss_scale = getattr(getattr(model_wrapped, "optimizer", None), "loss_scale", None)
    if fp16_enabled is None or not fp16_enabled() or loss_scale is None:
        return {}
    return {"loss_scale": float(loss_scale), "num_skipped_updates": get_num_skipped_updates(state)}
