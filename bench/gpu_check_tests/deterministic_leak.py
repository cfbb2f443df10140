"""gpu_check part `deterministic_leak`: does a test that leaves deterministic mode on break a later test?

Our own synthetic test file: `bench/gpu_check.py` copies it into a temporary folder as `test_deterministic_leak.py`
and runs it with pytest twice, without `CUBLAS_WORKSPACE_CONFIG` and `CUDA_LAUNCH_BLOCKING` in the environment:

1. `test_1_full_determinism_not_restored` calls transformers' `enable_full_determinism(42)`, as
   `TrainingArguments(full_determinism=True)` makes the Trainer do, and restores nothing. With GPU_CHECK_DECORATED=1
   it is decorated with transformers' `run_test_using_subprocess` (it then runs in a child pytest).
2. `test_2_op_without_deterministic_cuda_implementation` first records what the process holds after test 1
   (deterministic algorithms, the variables), then calls `torch.histc` on a CUDA tensor: torch's
   `use_deterministic_algorithms` docstring lists it among the operations that throw a RuntimeError in deterministic
   mode. Without CUDA it skips with the reason, after recording.

What test 2 saw goes to the JSON file GPU_CHECK_RECORD.
"""

import json
import os

import pytest
import torch

from transformers import enable_full_determinism
from transformers.testing_utils import run_test_using_subprocess


OP = "torch.histc on a CUDA tensor"
ENV_KEYS = ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "_INSIDE_SUB_PROCESS")


def test_1_full_determinism_not_restored():
    enable_full_determinism(42)
    assert torch.are_deterministic_algorithms_enabled()


if os.environ.get("GPU_CHECK_DECORATED") == "1":
    test_1_full_determinism_not_restored = run_test_using_subprocess(test_1_full_determinism_not_restored)


def test_2_op_without_deterministic_cuda_implementation():
    seen = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    seen |= {key: os.environ.get(key) for key in ENV_KEYS}
    path = os.environ.get("GPU_CHECK_RECORD")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"op": OP, "state_after_first_test": seen}, f)
    if not torch.cuda.is_available():
        pytest.skip("no CUDA: torch.cuda.is_available() is False")
    torch.histc(torch.rand(1000, device="cuda"), bins=10, min=0, max=1)
    torch.cuda.synchronize()
