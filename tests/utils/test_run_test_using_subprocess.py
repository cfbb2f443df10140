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

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from xml.etree import ElementTree as ET

from transformers.testing_utils import TestCasePlus, require_torch, slow
from transformers.utils import is_psutil_available


if is_psutil_available():
    import psutil

# Seconds: long enough for the subprocess to start and to reach the body of the test, even on a busy machine.
TIMEOUT = 30

# Tests decorated with `run_test_using_subprocess`, run once by `setUpClass` in their own pytest process.
DECORATED_TESTS = f"""
import os
import signal
import subprocess
import time
import unittest

import pytest
import torch
from parameterized import parameterized

from transformers.testing_utils import run_test_using_subprocess


class DecoratedTests(unittest.TestCase):
    @run_test_using_subprocess
    def test_pass(self):
        self.assertEqual(os.environ["_INSIDE_SUB_PROCESS"], "1")
        # `deterministic` is off by default
        self.assertFalse(torch.are_deterministic_algorithms_enabled())
        self.assertNotIn("CUBLAS_WORKSPACE_CONFIG", os.environ)

    @run_test_using_subprocess
    def test_fail(self):
        raise ValueError("failed in the subprocess")

    @run_test_using_subprocess
    def test_skip(self):
        self.skipTest("skipped in the subprocess")

    @run_test_using_subprocess
    def test_xfail(self):
        pytest.xfail("xfailed in the subprocess")

    @run_test_using_subprocess(env={{"ONLY_IN_SUB_PROCESS": "from the parent"}}, deterministic=True)
    def test_env_and_deterministic(self):
        self.assertEqual(os.environ["ONLY_IN_SUB_PROCESS"], "from the parent")
        self.assertTrue(torch.are_deterministic_algorithms_enabled())
        self.assertEqual(os.environ["CUBLAS_WORKSPACE_CONFIG"], ":4096:8")
        self.assertNotIn("CUDA_LAUNCH_BLOCKING", os.environ)

    @run_test_using_subprocess(timeout={TIMEOUT})
    def test_timeout(self):
        sleep = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(os.path.dirname(__file__), "sleep.pid"), "w") as f:
            f.write(str(sleep.pid))
        time.sleep(600)

    @run_test_using_subprocess
    def test_crash(self):
        os.kill(os.getpid(), signal.SIGSEGV)

    # The process id is in the name of the test, so the subprocess has another name for it
    @parameterized.expand([(str(os.getpid()),)])
    @run_test_using_subprocess
    def test_not_found(self, pid):
        pass
"""


# Slow: eight pytest subprocesses, each importing torch and transformers (about 90 s on 2 CPU cores, 30 s of which the
# timeout case waits); the decorator's usual path also runs in the tests that use it.
@slow
@require_torch
class RunTestUsingSubprocessTest(TestCasePlus):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp_dir = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.tmp_dir, ignore_errors=True)
        # The temporary directory of the pytest process, for `run_test_using_subprocess` to make its own in it
        cls.pytest_tmp_dir = os.path.join(cls.tmp_dir, "tmp")
        os.makedirs(cls.pytest_tmp_dir)
        with open(os.path.join(cls.tmp_dir, "test_decorated.py"), "w", encoding="utf-8") as f:
            f.write(DECORATED_TESTS)

        # Not affected by the environment of this process nor by the pytest plugins installed
        unset = ("_INSIDE_SUB_PROCESS", "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "PYTEST_ADDOPTS")
        env = {k: v for k, v in os.environ.items() if k not in unset}
        env.update(TMPDIR=cls.pytest_tmp_dir, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        junit = os.path.join(cls.tmp_dir, "junit.xml")
        pytest_args = ["-p", "no:cacheprovider", f"--junitxml={junit}", "test_decorated.py"]
        command = [sys.executable, "-m", "pytest", *pytest_args]
        cls.output = subprocess.run(command, cwd=cls.tmp_dir, env=env, capture_output=True, text=True).stdout
        cls.tmp_files_left = os.listdir(cls.pytest_tmp_dir)
        cls.files_left = os.listdir(cls.tmp_dir)
        cls.results = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}

    def assertOutcome(self, name, tag=None, type=None, message=None):
        """Checks the outcome of the test `name` in the pytest process (passed if `tag` is `None`)."""
        case = self.results[name]
        outcomes = [element for element in case if element.tag in ("failure", "error", "skipped")]
        self.assertEqual([element.tag for element in outcomes], [tag] if tag else [], self.output)
        if type is not None:
            self.assertEqual(outcomes[0].get("type"), type)
        if message is not None:
            self.assertIn(message, outcomes[0].get("message"))
        return outcomes[0].text if outcomes else None

    def test_pass(self):
        self.assertOutcome("test_pass")

    def test_fail(self):
        output = self.assertOutcome(
            "test_fail", "failure", message="(subprocess) ValueError: failed in the subprocess"
        )
        # The output of the subprocess comes with it
        self.assertIn('raise ValueError("failed in the subprocess")', output)

    def test_skip(self):
        self.assertOutcome("test_skip", "skipped", type="pytest.skip", message="skipped in the subprocess")

    def test_xfail(self):
        self.assertOutcome("test_xfail", "skipped", type="pytest.xfail", message="xfailed in the subprocess")

    def test_env_and_deterministic(self):
        self.assertOutcome("test_env_and_deterministic")

    @unittest.skipUnless(is_psutil_available(), "test requires psutil")
    def test_timeout(self):
        self.assertOutcome("test_timeout", "failure", message=f"test_timeout timed out after {TIMEOUT} seconds")
        # The `sleep` started by the test in the subprocess is killed as well (at most a zombie not reaped yet)
        with open(os.path.join(self.tmp_dir, "sleep.pid"), encoding="utf-8") as f:
            pid = int(f.read())
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            status = None
        self.assertIn(status, (None, psutil.STATUS_ZOMBIE))

    def test_crash(self):
        self.assertOutcome("test_crash", "failure", message="test_crash was killed by SIGSEGV")

    def test_not_found(self):
        (name,) = [name for name in self.results if name.startswith("test_not_found")]
        self.assertOutcome(name, "failure", message="could not be found by its node id in the subprocess")

    def test_nothing_is_left_behind(self):
        self.assertEqual(self.tmp_files_left, [])
        # No `.pytest_cache` from the subprocesses either
        self.assertEqual(sorted(self.files_left), ["junit.xml", "sleep.pid", "test_decorated.py", "tmp"])
