"""gpu_check part `parity_after_cublas`: the accelerator fp16 resume parity test in a process that used cuBLAS before.

Our own synthetic test file: `bench/gpu_check.py` copies it into a temporary folder as `test_cublas_then_parity.py`
and runs it with pytest, with `_INSIDE_SUB_PROCESS=1` (so `run_test_using_subprocess` runs the parity test in this
process), `RUN_SLOW=1` and neither `CUBLAS_WORKSPACE_CONFIG` nor `CUDA_LAUNCH_BLOCKING` in the environment:

1. `test_1_warmup_cublas_matmul_without_workspace_config` runs fp16 and fp32 matmuls on CUDA: cuBLAS creates its
   handle and workspace while the variable is unset.
2. `TestParityInSameProcess` is the parity test's class (GPU_CHECK_PARITY_NODE: `FILE::CLASS::METHOD`, FILE absolute),
   of which gpu_check selects METHOD; the test's `full_determinism` then sets the variable and deterministic
   algorithms in this same process. Every `torch.testing.assert_close` it makes is also measured here: the largest
   absolute difference between the resumed and the uninterrupted run. An exception the test method raises is recorded
   (type, message, the innermost frame: where it was raised) and raised again. A torch that still has its
   cuBLAS-configuration check raises its RuntimeError here at the first cuBLAS matmul after `full_determinism`. With
   GPU_CHECK_WARN_ONLY=1 (the warn_only variant) the Trainer's `enable_full_determinism` is called with
   `warn_only=True`, so that check warns instead, and the comparisons can be measured in a used worker.

What each test saw goes to the JSON file GPU_CHECK_RECORD. Without CUDA the matmul test skips with the reason, and the
parity test skips by its own decorators.
"""

import functools
import importlib.util
import json
import math
import os
import sys
import traceback
import unittest
from collections.abc import Mapping

import pytest
import torch


ENV_KEYS = ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "_INSIDE_SUB_PROCESS")
COMPARISONS = []  # the largest absolute difference of each assert_close the parity test made, in order


def record(key, value):
    """Adds `key` to the JSON file GPU_CHECK_RECORD (written whole each time; nothing without the variable)."""
    path = os.environ.get("GPU_CHECK_RECORD")
    if not path:
        return
    data = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    data[key] = value
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def state():
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
    } | {key: os.environ.get(key) for key in ENV_KEYS}


def max_abs_diff(actual, expected):
    """The largest absolute difference between two nested records (inf where their structure, shape or a non-number
    value differs, or a NaN or an infinity is in one only); 0.0 means equal everywhere (infinities and NaNs in the same
    places included)."""
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        if actual.shape != expected.shape:
            return math.inf
        if actual.numel() == 0:
            return 0.0
        a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
        # equal values differ by 0, infinities and NaNs in the same places included (an overflow's inf grad norm)
        diff = torch.where((a == e) | (a.isnan() & e.isnan()), 0.0, (a - e).abs())
        return math.inf if bool(diff.isnan().any()) else float(diff.max())
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            return math.inf
        return max((max_abs_diff(actual[k], expected[k]) for k in actual), default=0.0)
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            return math.inf
        return max((max_abs_diff(a, e) for a, e in zip(actual, expected)), default=0.0)
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        a, e = float(actual), float(expected)
        if a == e or (math.isnan(a) and math.isnan(e)):
            return 0.0
        diff = abs(a - e)
        return math.inf if math.isnan(diff) else diff
    return 0.0 if actual == expected else math.inf


def _measured_assert_close(original):
    def assert_close(actual, expected, *args, **kwargs):
        try:
            COMPARISONS.append(max_abs_diff(actual, expected))
        except Exception as e:  # the measurement must never change the test's outcome
            COMPARISONS.append(f"not measured: {type(e).__name__}: {e}")
        return original(actual, expected, *args, **kwargs)

    return assert_close


def _json_number(value):
    return value if isinstance(value, str) or math.isfinite(value) else str(value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA: torch.cuda.is_available() is False")
def test_1_warmup_cublas_matmul_without_workspace_config():
    before = state()
    assert before["CUBLAS_WORKSPACE_CONFIG"] is None, "CUBLAS_WORKSPACE_CONFIG is set: no warm-up without it"
    assert not before["deterministic_algorithms"], "deterministic algorithms are already on"
    generator = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float16, torch.float32):
        a = torch.randn(512, 512, device="cuda", dtype=dtype, generator=generator)
        (a @ a.T).sum().item()
    torch.cuda.synchronize()
    record("warmup", {"state_before": before, "state_after": state(), "dtypes": ["float16", "float32"]})


def _exception_record(error):
    """What a test method raised: its type, message and the innermost traceback frame (where it was raised)."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return {
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error)[:2000],
        "where": f"{frame.filename}:{frame.lineno} in {frame.name}",
    }


def _parity_test_class():
    """The parity test's class (GPU_CHECK_PARITY_NODE), measured: only this subclass is bound here, so pytest collects
    the class's tests once, through it."""
    node = os.environ.get("GPU_CHECK_PARITY_NODE")
    if not node:
        raise RuntimeError("GPU_CHECK_PARITY_NODE is not set")
    path, class_name = node.split("::")[:2]
    sys.path.insert(0, os.path.dirname(path))  # the test module's sibling imports
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    parity = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = parity
    spec.loader.exec_module(parity)

    class TestParityInSameProcess(getattr(parity, class_name)):
        def setUp(self):
            super().setUp()
            self._original_assert_close = torch.testing.assert_close
            torch.testing.assert_close = _measured_assert_close(self._original_assert_close)
            self._before = state()
            self._raised = None
            self._trainer_module = None
            if os.environ.get("GPU_CHECK_WARN_ONLY") == "1":  # the variant: the cuBLAS check warns instead of raising
                import transformers.trainer

                self._trainer_module, original = transformers.trainer, transformers.trainer.enable_full_determinism
                self._trainer_module.enable_full_determinism = functools.partial(original, warn_only=True)
                self._original_full_determinism = original

        def _callTestMethod(self, method):
            try:
                return super()._callTestMethod(method)
            except unittest.SkipTest:
                raise
            except Exception as e:
                self._raised = _exception_record(e)
                raise

        def tearDown(self):
            torch.testing.assert_close = self._original_assert_close
            if self._trainer_module is not None:
                self._trainer_module.enable_full_determinism = self._original_full_determinism
            record(
                f"parity:{self._testMethodName}",
                {
                    "state_before": self._before,
                    "state_after": state(),
                    "comparisons": [_json_number(c) for c in COMPARISONS],
                    "raised": self._raised,
                },
            )
            COMPARISONS.clear()
            super().tearDown()

    # TestCasePlus finds the repository's root from the file of the test's class: the parity test's, not this copy's
    TestParityInSameProcess.__module__ = parity.__name__
    return TestParityInSameProcess


try:
    TestParityInSameProcess = _parity_test_class()
except Exception:
    IMPORT_ERROR = traceback.format_exc(limit=-2)[-1500:]
    record("import_error", IMPORT_ERROR)

    def test_2_parity_on_accelerator_import_failed():
        pytest.fail(f"importing the parity test module failed:\n{IMPORT_ERROR}")
