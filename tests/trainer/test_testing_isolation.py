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
fresh process sees none of it, whatever the order the tests run in. Under `pytest -n`, `PoisonGlobalStateTest` may run
on another worker than the isolated tests: the `*_right_after_poisoning` and `*_across_processes` tests poison their own
process first, so that every worker checks isolation from a poisoned parent.
"""

import contextlib
import ctypes
import importlib.util
import json
import logging
import multiprocessing
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import warnings
from unittest import mock

import numpy as np
import pytest
import torch
from parameterized import parameterized

from transformers import testing_isolation
from transformers.testing_isolation import FreshProcessTestFailure, isolated_environ, run_test_in_fresh_process
from transformers.testing_utils import CaptureLogger, TestCasePlus, slow
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
        "num_threads": torch.get_num_threads(),
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
    torch.set_num_threads(state["num_threads"])
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


def _poison_num_threads():
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 3)
    return True


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
    "num_threads": _poison_num_threads,
    "random_state": _poison_random_state,
    "environment": _poison_environment,
}


def _poison_everything():
    for poison in POISONS.values():
        poison()


def _draw_random_numbers():
    return torch.rand(8), random.random(), np.random.rand(4)


def _fresh_interpreter_threads():
    """The thread counts of torch in a new interpreter started with the isolated environment."""
    command = [sys.executable, "-c", "import torch; print(torch.get_num_threads(), torch.get_num_interop_threads())"]
    output = subprocess.run(command, env=isolated_environ(), capture_output=True, text=True, check=True).stdout
    return tuple(int(value) for value in output.split())


def _check_thread_counts(expected_threads):
    assert (torch.get_num_threads(), torch.get_num_interop_threads()) == expected_threads


def _check_pristine_state(expected_environ):
    """Fails unless the process has the state `run_test_in_fresh_process` promises, whatever the parent did."""
    # What the server's warm-up ran is invisible: warnings, dtype, flags, generators (below), thread counts
    # (`test_thread_counts_are_those_of_a_new_interpreter`).
    assert not torch.is_autocast_enabled("cpu")
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark
    assert torch.backends.cudnn.deterministic
    assert torch.get_default_dtype() == torch.float32
    assert not torch.cuda.is_initialized()

    environ = dict(os.environ)
    # Each child has its own temporary folder, removed by the parent (see `OutcomeTest.test_*_are_removed`).
    assert environ.pop("TMPDIR") == tempfile.gettempdir() != expected_environ.get("TMPDIR")
    expected_environ = {key: value for key, value in expected_environ.items() if key != "TMPDIR"}
    assert POISON_VARIABLE not in environ
    assert set(environ) - set(expected_environ) <= ADDED_IN_CHILD, set(environ) - set(expected_environ)
    assert {key: environ.get(key) for key in expected_environ} == expected_environ

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
    @parameterized.expand([("first",), ("second",)])
    def test_state_is_pristine(self, _):
        run_test_in_fresh_process(_check_pristine_state)(isolated_environ())

    @run_test_in_fresh_process(seed=SEED)
    def test_tiny_model_training_is_bit_exact(self):
        first, second = _train_tiny_model(), _train_tiny_model()
        for name in first:
            self.assertTrue(torch.equal(first[name], second[name]), name)

    # This test and the next poison the parent themselves: under `pytest -n`, `PoisonGlobalStateTest` may have run on
    # another worker.
    def test_state_is_pristine_right_after_poisoning(self):
        _poison_everything()
        run_test_in_fresh_process(_check_pristine_state)(isolated_environ())

    def test_thread_counts_are_those_of_a_new_interpreter(self):
        # The warm-up runs on one thread and restores the counts; the parent's (poisoned here) do not reach the child.
        _poison_everything()
        run_test_in_fresh_process(_check_thread_counts)(_fresh_interpreter_threads())

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
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert {key: os.environ.get(key) for key in expected_environ if key != "TMPDIR"} == {
        key: value for key, value in expected_environ.items() if key != "TMPDIR"
    }


def _passes():
    pass


def _fails():
    print("marker written to stdout")
    print("marker written to stderr", file=sys.stderr)
    warnings.warn("marker warning")
    logging.getLogger("isolation_example").warning("marker logged")
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


def _write_record(record_file, pids, tmp_dir):
    """Tells the parent which processes and temporary folder the child made; the file is complete once it exists."""
    with open(record_file + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"pids": pids, "tmp_dir": tmp_dir}, f)
    os.replace(record_file + ".tmp", record_file)


def _leaves_a_grandchild_and_a_tmp_dir(record_file):
    grandchild = subprocess.Popen(["sleep", "600"])
    _write_record(record_file, [grandchild.pid], tempfile.mkdtemp())


def _sleeps_with_a_grandchild(record_file):
    grandchild = subprocess.Popen(["sleep", "600"])
    _write_record(record_file, [os.getpid(), grandchild.pid], tempfile.mkdtemp())
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])
    ctypes.CDLL(None).sleep(600)  # stuck in C code, deaf to the signals Python could handle


def _proc_stat(pid):
    """The fields of `/proc/<pid>/stat` after the command name: state, parent pid, ..."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return f.read().rsplit(")", 1)[1].split()


def _is_running(pid):
    """Whether `pid` is a live process (a zombie waiting for an init that does not reap counts as gone)."""
    try:
        return _proc_stat(pid)[0] != "Z"
    except FileNotFoundError:
        return False


# Run as a script by `test_child_dies_with_the_pytest_process`, standing for a pytest process.
PARENT_SCRIPT = """
import multiprocessing
import os
import sys
import time

from transformers.testing_isolation import run_test_in_fresh_process


def sleeps(record_file):
    # A pool makes a `pymp-*` folder in the temporary folder, and processes in the child's group.
    pool = multiprocessing.get_context("forkserver").Pool(1)
    pool.apply(os.getpid)
    with open(record_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(record_file + ".tmp", record_file)
    time.sleep(600)


if __name__ == "__main__":
    run_test_in_fresh_process(sleeps)(sys.argv[1])
"""


class DecoratedBelowExamples(unittest.TestCase):
    """Decorators placed below `run_test_in_fresh_process`; run by `DecoratorOrderTest`, not collected."""

    __test__ = False

    @run_test_in_fresh_process
    @unittest.skip("reason of the skip below")
    def test_skip(self):
        raise AssertionError("a skipped test ran")

    @run_test_in_fresh_process
    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    @run_test_in_fresh_process
    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass


@unittest.expectedFailure
class ExpectedFailureClassExamples(unittest.TestCase):
    """`unittest.expectedFailure` on the class: seen by the child too, still applied once; not collected."""

    __test__ = False

    @run_test_in_fresh_process
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    @run_test_in_fresh_process
    def test_unexpected_success(self):
        pass


class DecoratorOrderTest(unittest.TestCase):
    """The parent's runner applies `unittest.skip` and `unittest.expectedFailure` to the outcome of the child."""

    @parameterized.expand(
        [
            ("skip_below", DecoratedBelowExamples, "test_skip", "skipped"),
            ("expected_failure_below", DecoratedBelowExamples, "test_expected_failure", "expectedFailures"),
            ("unexpected_success_below", DecoratedBelowExamples, "test_unexpected_success", "unexpectedSuccesses"),
            ("expected_failure_class", ExpectedFailureClassExamples, "test_expected_failure", "expectedFailures"),
            (
                "unexpected_success_class",
                ExpectedFailureClassExamples,
                "test_unexpected_success",
                "unexpectedSuccesses",
            ),
        ]
    )
    def test_outcome(self, _, testcase_class, test_method, expected_kind):
        result = unittest.TestResult()
        testcase_class(test_method).run(result)  # `TestCase.run`: no module or class fixtures in this process
        kinds = ["errors", "failures", "skipped", "expectedFailures", "unexpectedSuccesses"]
        outcomes = {kind: len(getattr(result, kind)) for kind in kinds}
        self.assertEqual(outcomes, {**dict.fromkeys(kinds, 0), expected_kind: 1}, result.errors + result.failures)
        if expected_kind == "skipped":
            self.assertEqual(result.skipped[0][1], "reason of the skip below")
        if expected_kind == "expectedFailures":  # the failure of the child
            self.assertIn("FreshProcessTestFailure", result.expectedFailures[0][1])
            self.assertIn("1 != 2", result.expectedFailures[0][1])


class OutcomeTest(TestCasePlus):
    """The parent replays what happened in the child."""

    def test_pass(self):
        self.assertIsNone(run_test_in_fresh_process(_passes)())

    def test_failure_carries_traceback_and_output(self):
        with self.assertRaises(AssertionError) as context:
            run_test_in_fresh_process(_fails)()
        self.assertIsInstance(context.exception, FreshProcessTestFailure)
        message = str(context.exception)
        # Neither pytest's warning recorder nor its log handlers, set up when the server was forked, take the output.
        expected = ["assertion message of the child", "in _fails", "marker written to stdout", "stderr", "warning"]
        for marker in expected + ["UserWarning: marker warning", "\nmarker logged\n"]:
            self.assertIn(marker, message)

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
        with self.assertRaisesRegex(FreshProcessTestFailure, f"killed by signal {signal_name}") as context:
            run_test_in_fresh_process(body)()
        self.assertLess(time.monotonic() - start, 10)
        # `faulthandler` wrote where the child was to its output.
        self.assertRegex(str(context.exception), f"Fatal Python error: .*\n(.*\n)*.* in {body.__name__}")

    def _assert_all_gone(self, record_file, expected_pids):
        """The processes and the temporary folder the child recorded are gone."""
        with open(record_file, encoding="utf-8") as f:
            record = json.load(f)
        self.assertEqual(len(record["pids"]), expected_pids)
        deadline = time.monotonic() + 10  # the kernel may take a moment to reap the orphaned grandchild
        while any(_is_running(pid) for pid in record["pids"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse([pid for pid in record["pids"] if _is_running(pid)])
        self.assertFalse(os.path.exists(record["tmp_dir"]), record["tmp_dir"])

    @slow
    def test_timeout_kills_the_process_group(self):
        run_test_in_fresh_process(_passes)()  # the server is up
        record_file = os.path.join(self.get_auto_remove_tmp_dir(), "record.json")
        # On a loaded machine the child may need seconds to import this module: if it timed out before it reached the
        # body, try again with a longer timeout.
        for timeout in (5, 20):
            start = time.monotonic()
            with self.assertRaisesRegex(FreshProcessTestFailure, f"timed out after {timeout} s"):
                run_test_in_fresh_process(timeout=timeout)(_sleeps_with_a_grandchild)(record_file)
            elapsed = time.monotonic() - start
            if os.path.exists(record_file):
                break
        self.assertLess(elapsed, timeout + 10)  # the body sleeps for 600 s
        self._assert_all_gone(record_file, expected_pids=2)

    def test_interrupt_kills_the_process_group(self):
        """A Ctrl-C reaches the parent only (the child has its own process group): the parent kills the child."""
        record_file = os.path.join(self.get_auto_remove_tmp_dir(), "record.json")
        interrupted = []

        def interrupt_once_the_body_runs(signum, frame):
            if os.path.exists(record_file) and not interrupted:
                interrupted.append(True)
                raise KeyboardInterrupt

        previous_handler = signal.signal(signal.SIGALRM, interrupt_once_the_body_runs)
        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
        start = time.monotonic()
        try:
            with self.assertRaises(KeyboardInterrupt):
                run_test_in_fresh_process(timeout=300)(_sleeps_with_a_grandchild)(record_file)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
        self.assertLess(time.monotonic() - start, 120)
        self._assert_all_gone(record_file, expected_pids=2)

    def test_processes_and_temporary_files_left_by_a_passing_child_are_removed(self):
        record_file = os.path.join(self.get_auto_remove_tmp_dir(), "record.json")
        run_test_in_fresh_process(_leaves_a_grandchild_and_a_tmp_dir)(record_file)
        self._assert_all_gone(record_file, expected_pids=1)

    @run_test_in_fresh_process
    def _makes_a_tmp_dir_and_crashes(self, record_file):
        _write_record(record_file, [os.getpid()], self.get_auto_remove_tmp_dir())
        os.kill(os.getpid(), signal.SIGKILL)  # `tearDown` never runs

    def test_temporary_files_of_a_crashed_child_are_removed(self):
        record_file = os.path.join(self.get_auto_remove_tmp_dir(), "record.json")
        with self.assertRaisesRegex(FreshProcessTestFailure, "killed by signal SIGKILL"):
            self._makes_a_tmp_dir_and_crashes(record_file)
        self._assert_all_gone(record_file, expected_pids=1)

    @slow
    @unittest.skipUnless(sys.platform.startswith("linux"), "PR_SET_PDEATHSIG is Linux only")
    def test_child_dies_with_the_pytest_process(self):
        """
        A parent killed with `SIGKILL` (no `finally` runs) takes its server and child with it, and leaves nothing in
        its temporary folder (~5 s).
        """
        tmp_dir = self.get_auto_remove_tmp_dir()
        script, record_file = os.path.join(tmp_dir, "parent.py"), os.path.join(tmp_dir, "record")
        parent_tmp_dir = os.path.join(tmp_dir, "tmp")
        os.mkdir(parent_tmp_dir)
        with open(script, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(PARENT_SCRIPT))
        environ = {**isolated_environ(), "TMPDIR": parent_tmp_dir}
        parent = subprocess.Popen([sys.executable, script, record_file], cwd=tmp_dir, env=environ)
        try:
            deadline = time.monotonic() + 120
            while not os.path.exists(record_file) and parent.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            with open(record_file, encoding="utf-8") as f:
                child = int(f.read())
            server = int(_proc_stat(child)[1])
        finally:
            parent.kill()
            parent.wait()
        deadline = time.monotonic() + 30
        while (_is_running(child) or _is_running(server)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left_running = [pid for pid in (child, server) if _is_running(pid)]
        for pid in left_running:  # do not leave them behind when the test fails
            os.kill(pid, signal.SIGKILL)
        self.assertFalse(left_running, "the child or its server survived the parent")
        # torch's own cache folder (`torchinductor_<user>`), made on import, is there whether tests run isolated or not.
        left = [name for name in os.listdir(parent_tmp_dir) if not name.startswith("torchinductor_")]
        self.assertEqual(left, [], "the workdir of the child (fresh_process_*) or its pool's pymp-* folder was left")

    def test_local_function_is_refused(self):
        def local_test():
            pass

        with self.assertRaisesRegex(FreshProcessTestFailure, "local_test: .*cannot find"):
            run_test_in_fresh_process(local_test)()


def _exits_without_a_result():
    os._exit(0)


def _kills_its_process_group():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.killpg(0, signal.SIGKILL)


def _kills_the_server():
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(600)


def _check_seed(seed):
    assert torch.initial_seed() == seed
    drawn = _draw_random_numbers()
    set_seed(seed)
    reference = _draw_random_numbers()
    assert torch.equal(drawn[0], reference[0]) and drawn[1] == reference[1]
    assert np.array_equal(drawn[2], reference[2])


def _check_variable(name, expected):
    assert os.environ.get(name) == expected, f"{name}={os.environ.get(name)!r}"


def _takes(value):
    pass


def _starts_a_pool(record_file):
    """A `multiprocessing` pool in the child (its `pymp-*` folder goes to the child's `TMPDIR`), then sleeps."""
    pool = multiprocessing.get_context("forkserver").Pool(1)
    pool.apply(os.getpid)
    with open(record_file + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    os.replace(record_file + ".tmp", record_file)
    time.sleep(600)


class ContractTest(TestCasePlus):
    """Each test here fails if one promise of `run_test_in_fresh_process` is broken."""

    def test_child_exiting_without_a_result_fails(self):
        with self.assertRaisesRegex(FreshProcessTestFailure, "exited with code 0 without reporting a result"):
            run_test_in_fresh_process(_exits_without_a_result)()

    def test_seed_argument_is_used(self):
        run_test_in_fresh_process(seed=1234)(_check_seed)(1234)
        run_test_in_fresh_process(_check_seed)(42)  # the default

    def test_exact_isolation_variables(self):
        self.assertEqual(testing_isolation.ISOLATION_ENV, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
        run_test_in_fresh_process(_check_variable)("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    def test_pytest_current_test_is_forwarded(self):
        value = "tests/trainer/test_example.py::ExampleTest::test_it (call)"
        with mock.patch.dict(os.environ, {"PYTEST_CURRENT_TEST": value}):
            run_test_in_fresh_process(_check_variable)("PYTEST_CURRENT_TEST", value)

    def test_environment_snapshot_is_taken_on_import(self):
        """A variable set after the module is imported (by an earlier test) does not reach the children."""
        # A new copy of the module, imported in a clean environment that a later test then poisons.
        spec = importlib.util.spec_from_file_location("transformers._isolation_copy", testing_isolation.__file__)
        module = importlib.util.module_from_spec(spec)
        with mock.patch.dict(os.environ, isolated_environ(), clear=True):
            spec.loader.exec_module(module)
            os.environ[POISON_VARIABLE] = "1"
            self.assertNotIn(POISON_VARIABLE, module.isolated_environ())

    def test_unpicklable_arguments_fail_clearly(self):
        with self.assertRaisesRegex(FreshProcessTestFailure, r"_takes: the arguments .* cannot be pickled"):
            run_test_in_fresh_process(_takes)(lambda: None)

    def test_child_killing_its_process_group_fails_and_the_next_test_runs(self):
        with self.assertRaisesRegex(FreshProcessTestFailure, "_kills_its_process_group crashed: killed by signal"):
            run_test_in_fresh_process(_kills_its_process_group)()
        run_test_in_fresh_process(_passes)()

    @slow
    def test_server_death_fails_clearly_and_the_next_test_gets_a_new_server(self):
        """Stands for the server being killed from outside (out of memory) while a test runs."""
        run_test_in_fresh_process(_passes)()
        server = testing_isolation._server
        start = time.monotonic()
        with self.assertRaisesRegex(
            FreshProcessTestFailure, r"_kills_the_server: the test server \(pid \d+\) was killed by signal SIGKILL"
        ):
            run_test_in_fresh_process(_kills_the_server)()
        self.assertLess(time.monotonic() - start, 30)
        run_test_in_fresh_process(_passes)()
        self.assertIsNot(testing_isolation._server, server)

    def test_server_that_cannot_start_fails_clearly(self):
        script = os.path.join(self.get_auto_remove_tmp_dir(), "python")
        with open(script, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\necho 'no torch here' >&2\nexit 3\n")
        os.chmod(script, 0o755)
        with mock.patch.object(testing_isolation, "_server", None), mock.patch.object(sys, "executable", script):
            with self.assertRaisesRegex(
                FreshProcessTestFailure, "_passes: The test server did not start: no torch here"
            ):
                run_test_in_fresh_process(_passes)()
            with self.assertRaisesRegex(FreshProcessTestFailure, "_passes: The test server could not be started"):
                with mock.patch.object(sys, "executable", script + "_missing"):
                    run_test_in_fresh_process(_passes)()

    def test_nothing_is_left_in_the_temporary_folder(self):
        tmp_dir = self.get_auto_remove_tmp_dir()
        bodies = [_passes, _fails, _skips_with_unittest, _segfaults, _exits_without_a_result, _kills_its_process_group]
        with mock.patch.object(tempfile, "tempdir", tmp_dir):
            for body in bodies:
                with contextlib.suppress(AssertionError, unittest.SkipTest):
                    run_test_in_fresh_process(body)()
                self.assertEqual(os.listdir(tmp_dir), [], body.__name__)


def _collecting_environ():
    """The environment of a pytest process while it imports the test modules: no test is running."""
    environ = {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}
    return {**environ, "PYTEST_VERSION": pytest.__version__}


@contextlib.contextmanager
def _server_of_the_test():
    """
    Hides the server of this process behind one the test makes (discarded at the end). The threads that earlier tests
    of this worker may have started (an OpenMP pool) count as there since the import, so that a copy can be made.
    """
    with (
        mock.patch.object(testing_isolation, "_server", None),
        mock.patch.object(testing_isolation, "_threads_at_import", testing_isolation._thread_count()),
    ):
        try:
            yield
        finally:
            if testing_isolation._server is not None:
                testing_isolation._discard_server(testing_isolation._server)


class ServerTest(TestCasePlus):
    """How the test server is made: a copy of the pytest process while it collects, or a new interpreter."""

    @unittest.skipUnless(
        sys.platform.startswith("linux") and testing_isolation._built_for_cpu_only(torch),
        "the server is only forked on Linux, with a torch built for the CPU only",
    )
    def test_server_is_forked_while_collecting_until_a_test_uses_it(self):
        with _server_of_the_test():
            with mock.patch.dict(os.environ, _collecting_environ(), clear=True):
                testing_isolation._fork_server_while_collecting()
                first = testing_isolation._server
                self.assertTrue(first.forked)
                self.assertIsNone(first.process.poll())
                testing_isolation._fork_server_while_collecting()  # nothing more imported: the same server
                self.assertIs(testing_isolation._server, first)
                more = first.preloaded + 1
                with mock.patch.object(testing_isolation, "_preloaded_count", return_value=more):
                    testing_isolation._fork_server_while_collecting()
                second = testing_isolation._server
                self.assertIsNot(second, first)
                self.assertIsNotNone(first.process.returncode)  # the copy nothing used is gone, and reaped
                second.start()
                with mock.patch.object(testing_isolation, "_preloaded_count", return_value=more + 1):
                    testing_isolation._fork_server_while_collecting()
                self.assertIs(testing_isolation._server, second)  # a test used it: never replaced
            testing_isolation._discard_server(second)
            testing_isolation._fork_server_while_collecting()  # a test is running: no copy of this process
            self.assertIsNone(testing_isolation._server)
            stop = threading.Event()
            thread = threading.Thread(target=stop.wait)
            thread.start()
            try:
                with mock.patch.dict(os.environ, _collecting_environ(), clear=True):
                    testing_isolation._fork_server_while_collecting()  # a thread more than at import: no copy
            finally:
                stop.set()
                thread.join()
            self.assertIsNone(testing_isolation._server)

    @slow
    def test_new_interpreter_replaces_a_forked_server_that_cannot_start(self):
        """The new interpreter is also the server of CUDA, ROCm and XPU builds, and the one replacing a dead server."""
        with _server_of_the_test():
            with (
                mock.patch.dict(os.environ, _collecting_environ(), clear=True),
                mock.patch.object(testing_isolation, "_warm_up", side_effect=RuntimeError("warm-up broken")),
            ):
                testing_isolation._fork_server_while_collecting()
            forked = testing_isolation._server
            with CaptureLogger(testing_isolation.logger) as captured:
                _poison_everything()
                run_test_in_fresh_process(_check_pristine_state)(isolated_environ())
                run_test_in_fresh_process(_check_thread_counts)(_fresh_interpreter_threads())
            if forked is not None:  # forked on Linux with a CPU-only torch
                self.assertIn("warm-up broken", captured.out)
                self.assertIsNotNone(forked.process.returncode)
            self.assertFalse(testing_isolation._server.forked)


FIXTURE_CALLS = []


class FixtureExamples(TestCasePlus):
    """Run by `FixtureTest`, not collected: its fixtures record where they ran."""

    __test__ = False

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        FIXTURE_CALLS.append(("setUpClass", os.getpid()))

    @classmethod
    def tearDownClass(cls):
        FIXTURE_CALLS.append(("tearDownClass", os.getpid()))
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        FIXTURE_CALLS.append(("setUp", os.getpid()))

    def tearDown(self):
        FIXTURE_CALLS.append(("tearDown", os.getpid()))
        super().tearDown()

    @parameterized.expand([("parameterized",)])
    @run_test_in_fresh_process
    def test_fixtures_ran_once_here(self, _):
        self.assertEqual(FIXTURE_CALLS, [("setUpClass", os.getpid()), ("setUp", os.getpid())])

    @run_test_in_fresh_process
    def test_failing_subtest(self):
        for value in (1, 2):
            with self.subTest(value=value):
                self.assertEqual(value, 1)

    @unittest.skip("skipped in the parent")
    @run_test_in_fresh_process
    def test_skipped(self):
        pass


class FixtureTest(unittest.TestCase):
    def run_example(self, name):
        FIXTURE_CALLS.clear()
        result = unittest.TestResult()
        # A suite, as pytest and unittest run it: class fixtures included.
        unittest.TestSuite([FixtureExamples(name)]).run(result)
        self.assertEqual(FIXTURE_CALLS, [], "a fixture ran in the parent")
        return result

    def test_fixtures_run_in_the_child_only(self):
        result = self.run_example("test_fixtures_ran_once_here_0_parameterized")
        self.assertEqual(result.errors + result.failures, [])
        self.assertEqual(result.testsRun, 1)

    def test_failing_subtest_fails(self):
        result = self.run_example("test_failing_subtest")
        self.assertEqual(len(result.failures), 1)
        self.assertIn("2 != 1", result.failures[0][1])

    def test_skip_decides_in_the_parent_without_a_child(self):
        with mock.patch.object(testing_isolation, "_run_in_child", side_effect=AssertionError("a child started")):
            result = self.run_example("test_skipped")
        self.assertEqual([reason for _, reason in result.skipped], ["skipped in the parent"])


def _use_pool(start_method):
    with multiprocessing.get_context(start_method).Pool(1) as pool:
        return pool.apply(os.getpid) != os.getpid()


def _use_dataloader(start_method):
    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=1, multiprocessing_context=start_method)
    return [batch.tolist() for batch in loader] == [[0], [1], [2], [3]]


class OtherProcessUsersTest(unittest.TestCase):
    """
    Other code of the pytest process using `multiprocessing` (pools, DataLoader workers, any start method, the
    process-wide forkserver) before or after isolated tests does not change what the isolated tests see.
    """

    def check_isolated(self):
        run_test_in_fresh_process(_check_variable)("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    @parameterized.expand([("fork",), ("spawn",), ("forkserver",)])
    def test_pool_before_and_after(self, start_method):
        self.assertTrue(_use_pool(start_method))
        self.check_isolated()
        self.assertTrue(_use_pool(start_method))

    def test_dataloader_workers_and_forced_forkserver_default(self):
        """What Python 3.14 does on Linux: forkserver as the default start method, then DataLoader workers."""
        previous = multiprocessing.get_start_method(allow_none=True)
        multiprocessing.set_start_method("forkserver", force=True)
        try:
            self.assertTrue(_use_dataloader(None))
            self.check_isolated()
            self.assertTrue(_use_dataloader("fork"))
        finally:
            multiprocessing.set_start_method(previous, force=True)


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

    @run_test_in_fresh_process
    @unittest.skip("skipped below")
    def test_method_skipped_below(self):
        pass

    @run_test_in_fresh_process
    @unittest.expectedFailure
    def test_method_expected_failure_below(self):
        assert False
"""


@slow
class PytestReportTest(TestCasePlus):
    def test_pytest_reports_the_outcome_of_the_child(self):
        """Under pytest, a test skipped in the child is reported as skipped, not passed (one pytest run, ~10 s)."""
        tmp_dir = self.get_auto_remove_tmp_dir()
        with open(os.path.join(tmp_dir, "test_example.py"), "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(EXAMPLE_TESTS))
        command = [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly", tmp_dir]
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
            "ExampleTest::test_method_skipped_below": "SKIPPED",
            "ExampleTest::test_method_expected_failure_below": "XFAIL",
        }
        self.assertEqual(outcomes, expected, run.stdout)
        self.assertIn("skipped below", run.stdout)


PLUGIN_EXAMPLE_TESTS = """
import json
import os
import subprocess
import time

import pytest

from transformers.testing_isolation import run_test_in_fresh_process


RECORDS = os.environ["ISOLATION_EXAMPLE_RECORDS"]


def record(name):
    grandchild = subprocess.Popen(["sleep", "600"])
    path = os.path.join(RECORDS, name)
    with open(path + ".tmp", "w") as f:
        json.dump([os.getpid(), grandchild.pid], f)
    os.replace(path + ".tmp", path)


# First: the server starts in this test, which pytest-timeout would count in the test's time.
@pytest.mark.flaky(reruns=1)
@run_test_in_fresh_process
def test_1_passes_on_rerun():
    marker = os.path.join(RECORDS, "first_try")
    if not os.path.exists(marker):
        open(marker, "w").close()
        assert False, "fails the first time"


@pytest.mark.timeout(10)
@run_test_in_fresh_process
def test_2_times_out():
    record("timeout")
    time.sleep(600)


@run_test_in_fresh_process
def test_3_interrupted():
    record("interrupt")
    time.sleep(600)
"""


@unittest.skipUnless(
    importlib.util.find_spec("pytest_timeout") and importlib.util.find_spec("pytest_rerunfailures"),
    "needs pytest-timeout and pytest-rerunfailures (upstream's test extras; `utils/upstream_pins.py` installs them)",
)
@slow
class PytestPluginsTest(TestCasePlus):
    def test_timeout_rerun_and_interrupt(self):
        """
        Under upstream's plugins: a pytest-timeout expiry fails the test, a pytest-rerunfailures rerun runs a new child,
        a Ctrl-C stops the session; every child and what it started is gone, nothing is left in the temporary folder.
        """
        tmp_dir = self.get_auto_remove_tmp_dir()
        records, pytest_tmp_dir = os.path.join(tmp_dir, "records"), os.path.join(tmp_dir, "tmp")
        os.mkdir(records)
        os.mkdir(pytest_tmp_dir)
        with open(os.path.join(tmp_dir, "test_plugins_example.py"), "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(PLUGIN_EXAMPLE_TESTS))
        environ = {**isolated_environ(), "ISOLATION_EXAMPLE_RECORDS": records, "TMPDIR": pytest_tmp_dir}
        # Under `pytest-xdist` this test runs in a worker that ignores SIGINT, which a subprocess would inherit.
        command = [
            sys.executable,
            "-c",
            "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.exit(pytest.main(sys.argv[1:]))",
            *["-v", "-p", "no:cacheprovider", "-p", "no:random_order", tmp_dir],
        ]
        with open(os.path.join(tmp_dir, "output.txt"), "w+", encoding="utf-8") as output:
            session = subprocess.Popen(command, cwd=tmp_dir, env=environ, stdout=output, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 300
                while not os.path.exists(os.path.join(records, "interrupt")) and time.monotonic() < deadline:
                    self.assertIsNone(session.poll(), "pytest ended before the last test started")
                    time.sleep(0.1)
                session.send_signal(signal.SIGINT)
                session.wait(60)
            finally:
                if session.poll() is None:
                    session.kill()
                    session.wait()
            output.seek(0)
            report = output.read()
        self.assertEqual(session.returncode, 2, report)  # interrupted
        self.assertIn("KeyboardInterrupt", report)
        outcomes = re.findall(r"::(test_\w+) (PASSED|FAILED|RERUN)", report)
        expected = [("test_1_passes_on_rerun", "RERUN"), ("test_1_passes_on_rerun", "PASSED")]
        self.assertEqual(outcomes, expected + [("test_2_times_out", "FAILED")], report)
        self.assertIn("Timeout", report)
        pids = []
        for name in ("timeout", "interrupt"):
            with open(os.path.join(records, name), encoding="utf-8") as f:
                pids += json.load(f)
        deadline = time.monotonic() + 10
        while any(_is_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([pid for pid in pids if _is_running(pid)], [])
        left = [name for name in os.listdir(pytest_tmp_dir) if not name.startswith("torchinductor_")]
        self.assertEqual(left, [])
