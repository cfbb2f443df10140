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
Tests of `transformers.testing_isolation.run_test_in_fresh_process`.

`PoisonGlobalStateTest` deliberately leaves process-global state poisoned for the tests that run after it in the same
worker; the state is only restored when the module is done (`tearDownModule`). The isolated tests check that their
fresh process sees none of it, whatever the order the tests run in.
"""

import os
import random
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
import unittest

import numpy as np
import pytest
import torch
from parameterized import parameterized

from transformers.testing_isolation import (
    FreshProcessTestFailure,
    _check_preloaded,
    isolated_environ,
    run_test_in_fresh_process,
)
from transformers.testing_utils import TestCasePlus
from transformers.trainer_utils import set_seed


SEED = 42
POISON_VARIABLE = "TRANSFORMERS_TESTING_ISOLATION_POISON"
# What `enable_full_determinism` exports on top of the isolated environment, and what pytest sets for each test.
ADDED_IN_CHILD = {
    "CUDA_LAUNCH_BLOCKING",
    "ASCEND_LAUNCH_BLOCKING",
    "HCCL_DETERMINISTIC",
    "FLASH_ATTENTION_DETERMINISTIC",
    "PYTEST_CURRENT_TEST",
}


def _save_global_state():
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "default_dtype": torch.get_default_dtype(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "environ": dict(os.environ),
    }


def _restore_global_state(state):
    torch.use_deterministic_algorithms(state["deterministic"], warn_only=state["warn_only"])
    torch.backends.cudnn.benchmark = state["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = state["cudnn_deterministic"]
    torch.set_default_dtype(state["default_dtype"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    os.environ.clear()
    os.environ.update(state["environ"])


_state_before_module = None


def setUpModule():
    global _state_before_module
    _state_before_module = _save_global_state()


def tearDownModule():
    _restore_global_state(_state_before_module)


def _poison_deterministic_algorithms():
    torch.use_deterministic_algorithms(False)
    return not torch.are_deterministic_algorithms_enabled()


def _poison_cudnn_flags():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    return torch.backends.cudnn.benchmark


def _poison_default_dtype():
    torch.set_default_dtype(torch.float64)
    return torch.get_default_dtype() == torch.float64


def _poison_random_state():
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return torch.initial_seed() == seed


def _poison_environment():
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    os.environ["PYTHONHASHSEED"] = "1234"
    os.environ[POISON_VARIABLE] = "1"
    return POISON_VARIABLE in os.environ


POISONS = {
    "deterministic_algorithms": _poison_deterministic_algorithms,
    "cudnn_flags": _poison_cudnn_flags,
    "default_dtype": _poison_default_dtype,
    "random_state": _poison_random_state,
    "environment": _poison_environment,
}


def _poison_everything():
    for poison in POISONS.values():
        poison()


def _draw_random_numbers():
    return torch.rand(8), random.random(), np.random.rand(4)


def _check_pristine_state(expected_environ):
    """Fails unless the process has the state `run_test_in_fresh_process` promises, whatever the parent did."""
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark
    assert torch.backends.cudnn.deterministic
    assert torch.get_default_dtype() == torch.float32
    assert not torch.cuda.is_initialized()

    environ = dict(os.environ)
    assert POISON_VARIABLE not in environ
    assert set(environ) - set(expected_environ) <= ADDED_IN_CHILD, set(environ) - set(expected_environ)
    assert {key: environ.get(key) for key in expected_environ} == expected_environ
    assert sys.flags.hash_randomization == 0  # PYTHONHASHSEED=0 was there when the interpreter started

    # The generators are exactly as `enable_full_determinism(SEED)` left them.
    drawn = _draw_random_numbers()
    set_seed(SEED)
    reference = _draw_random_numbers()
    assert torch.equal(drawn[0], reference[0])
    assert drawn[1] == reference[1]
    assert np.array_equal(drawn[2], reference[2])


def _train_tiny_model(steps=5):
    """A seeded forward/backward/step loop on a tiny model; returns the final parameters."""
    set_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    inputs, targets = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def _save_tiny_model_training(path):
    torch.save(_train_tiny_model(), path)


class PoisonGlobalStateTest(unittest.TestCase):
    """Leaves global state poisoned on purpose: `tearDownModule` restores it, nothing in between."""

    @parameterized.expand(list(POISONS))
    def test_poison(self, name):
        self.assertTrue(POISONS[name]())


class IsolatedStateTest(TestCasePlus):
    @parameterized.expand([("first", isolated_environ()), ("second", isolated_environ())])
    @run_test_in_fresh_process
    def test_state_is_pristine(self, _, expected_environ):
        _check_pristine_state(expected_environ)

    @run_test_in_fresh_process(seed=SEED)
    def test_tiny_model_training_is_bit_exact(self):
        first, second = _train_tiny_model(), _train_tiny_model()
        for name in first:
            self.assertTrue(torch.equal(first[name], second[name]), name)

    def test_state_is_pristine_right_after_poisoning(self):
        _poison_everything()
        run_test_in_fresh_process(_check_pristine_state)(isolated_environ())

    def test_training_is_bit_exact_across_processes(self):
        tmp_dir = self.get_auto_remove_tmp_dir()
        paths = [os.path.join(tmp_dir, f"run_{index}.pt") for index in range(2)]
        run_test_in_fresh_process(_save_tiny_model_training)(paths[0])
        _poison_everything()
        run_test_in_fresh_process(_save_tiny_model_training)(paths[1])
        first, second = (torch.load(path) for path in paths)
        for name in first:
            self.assertEqual(first[name].dtype, torch.float32)
            self.assertTrue(torch.equal(first[name], second[name]), name)


@pytest.mark.parametrize("expected_environ", [isolated_environ()])
@run_test_in_fresh_process
def test_plain_function_is_isolated(tmp_path, expected_environ):
    assert tmp_path.is_dir()  # the values of fixtures and parameters are pickled to the child
    _check_pristine_state(expected_environ)


def _passes():
    pass


def _fails():
    print("marker written to stdout")
    print("marker written to stderr", file=sys.stderr)
    assert 1 == 2, "assertion message of the child"


def _skips_with_unittest():
    raise unittest.SkipTest("reason of the unittest skip")


def _skips_with_pytest():
    pytest.skip("reason of the pytest skip")


def _xfails():
    pytest.xfail("reason of the xfail")


def _segfaults():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.kill(os.getpid(), signal.SIGSEGV)


def _aborts():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.abort()


def _sleeps_with_a_grandchild(pid_file):
    grandchild = subprocess.Popen(["sleep", "60"])
    with open(pid_file, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {grandchild.pid}")
    time.sleep(60)


def _is_running(pid):
    """Whether `pid` is a live process (a zombie waiting for an init that does not reap counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class OutcomeTest(TestCasePlus):
    """The parent replays what happened in the child."""

    def test_pass(self):
        self.assertIsNone(run_test_in_fresh_process(_passes)())

    def test_failure_carries_traceback_and_output(self):
        with self.assertRaises(AssertionError) as context:
            run_test_in_fresh_process(_fails)()
        self.assertIsInstance(context.exception, FreshProcessTestFailure)
        message = str(context.exception)
        for expected in ["assertion message of the child", "in _fails", "marker written to stdout", "stderr"]:
            self.assertIn(expected, message)

    @parameterized.expand([("unittest", _skips_with_unittest), ("pytest", _skips_with_pytest)])
    def test_skip(self, kind, body):
        with self.assertRaises(unittest.SkipTest) as context:
            run_test_in_fresh_process(body)()
        self.assertEqual(str(context.exception), f"reason of the {kind} skip")

    def test_xfail(self):
        with self.assertRaises(pytest.xfail.Exception) as context:
            run_test_in_fresh_process(_xfails)()
        self.assertEqual(context.exception.msg, "reason of the xfail")

    @parameterized.expand([("segfault", _segfaults, "SIGSEGV"), ("abort", _aborts, "SIGABRT")])
    def test_crash(self, _, body, signal_name):
        run_test_in_fresh_process(_passes)()  # the server is up: time the crash only
        start = time.monotonic()
        with self.assertRaisesRegex(FreshProcessTestFailure, f"killed by signal {signal_name}"):
            run_test_in_fresh_process(body)()
        self.assertLess(time.monotonic() - start, 10)

    def test_timeout_kills_the_process_group(self):
        run_test_in_fresh_process(_passes)()
        pid_file = os.path.join(self.get_auto_remove_tmp_dir(), "pids")
        start = time.monotonic()
        with self.assertRaisesRegex(FreshProcessTestFailure, r"timed out after 1 s"):
            run_test_in_fresh_process(timeout=1)(_sleeps_with_a_grandchild)(pid_file)
        self.assertLess(time.monotonic() - start, 10)
        with open(pid_file, encoding="utf-8") as f:
            pids = [int(pid) for pid in f.read().split()]
        self.assertEqual(len(pids), 2)
        deadline = time.monotonic() + 5  # the kernel may take a moment to reap the orphaned grandchild
        while any(_is_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse([pid for pid in pids if _is_running(pid)])

    def test_preload_errors_are_reported(self):
        with self.assertRaisesRegex(RuntimeError, "could not preload") as context:
            _check_preloaded(["torch", "transformers_module_that_does_not_exist"])
        self.assertIsInstance(context.exception.__cause__, ModuleNotFoundError)

    def test_local_function_is_refused(self):
        def local_test():
            pass

        with self.assertRaisesRegex(TypeError, "cannot find"):
            run_test_in_fresh_process(local_test)()


EXAMPLE_TESTS = """
import unittest

import pytest
from parameterized import parameterized

from transformers.testing_isolation import run_test_in_fresh_process


@run_test_in_fresh_process
def test_function_passes():
    pass


@run_test_in_fresh_process
def test_function_skips():
    pytest.skip("skipped in the child")


@run_test_in_fresh_process
def test_function_xfails():
    pytest.xfail("xfailed in the child")


@run_test_in_fresh_process
def test_function_fails():
    assert False


class ExampleTest(unittest.TestCase):
    @parameterized.expand([("one", 1), ("two", 2)])
    @run_test_in_fresh_process
    def test_method(self, _, value):
        self.assertEqual(value, 1)

    @run_test_in_fresh_process
    def test_method_skips(self):
        self.skipTest("skipped in the child")

    @run_test_in_fresh_process
    def test_method_xfails(self):
        pytest.xfail("xfailed in the child")
"""


class PytestReportTest(TestCasePlus):
    def test_pytest_reports_the_outcome_of_the_child(self):
        """Under pytest, a test skipped in the child is reported as skipped, not passed (one pytest run, ~10 s)."""
        tmp_dir = self.get_auto_remove_tmp_dir()
        with open(os.path.join(tmp_dir, "test_example.py"), "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(EXAMPLE_TESTS))
        command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:randomly", tmp_dir]
        run = subprocess.run(command, cwd=tmp_dir, env=isolated_environ(), capture_output=True, text=True)
        outcomes = dict(re.findall(r"::(\S+) (PASSED|SKIPPED|XFAIL|FAILED)", run.stdout))
        expected = {
            "test_function_passes": "PASSED",
            "test_function_skips": "SKIPPED",
            "test_function_xfails": "XFAIL",
            "test_function_fails": "FAILED",
            "ExampleTest::test_method_0_one": "PASSED",
            "ExampleTest::test_method_1_two": "FAILED",
            "ExampleTest::test_method_skips": "SKIPPED",
            "ExampleTest::test_method_xfails": "XFAIL",
        }
        self.assertEqual(outcomes, expected, run.stdout)
