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
"""`run_test_using_subprocess` reports a test skipped or xfailed in its subprocess as skipped or xfailed."""

import importlib.util
import os
import tempfile
import unittest
from unittest import mock

import pytest

from transformers.testing_utils import SINGLE_PROCESS_DEVICES, TestCasePlus, torch_device


DECORATED_TESTS = """
import unittest

import pytest

from transformers.testing_utils import run_test_using_subprocess


class DecoratedTest(unittest.TestCase):
    @run_test_using_subprocess
    def test_skipped(self):
        self.skipTest("skipped in the subprocess")

    @run_test_using_subprocess
    def test_xfailed(self):
        pytest.xfail("xfailed in the subprocess")
"""


def load_decorated_tests(folder):
    """The module of `DECORATED_TESTS`, written to `folder`, and its path."""
    path = os.path.join(folder, "test_decorated.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(DECORATED_TESTS)
    spec = importlib.util.spec_from_file_location("test_decorated", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


class RunTestUsingSubprocessInProcessTest(TestCasePlus):
    def test_outcomes_in_process(self):
        """Where the decorator runs the test in this process (inside its subprocess), a skip or xfail stays one."""
        module, _ = load_decorated_tests(self.get_auto_remove_tmp_dir())
        for name, outcome in (("test_skipped", unittest.SkipTest), ("test_xfailed", pytest.xfail.Exception)):
            with self.subTest(name), mock.patch.dict(os.environ, {"_INSIDE_SUB_PROCESS": "1"}):
                os.environ.pop("_SUB_PROCESS_OUTCOME_FILE", None)  # no parent waits for the outcome
                with self.assertRaises((unittest.SkipTest, pytest.skip.Exception, pytest.xfail.Exception)) as raised:
                    getattr(module.DecoratedTest(name), name)()
                self.assertIsInstance(raised.exception, outcome)


@unittest.skipIf(
    os.getenv("_INSIDE_SUB_PROCESS") == "1" or torch_device in SINGLE_PROCESS_DEVICES,
    "the decorator runs the test in this process",
)
class RunTestUsingSubprocessOutcomeTest(TestCasePlus):
    def check_outcome(self, name, outcome, addopts=""):
        """Calls the decorated test `name` as pytest would; it raises `outcome`, whose reason is returned."""
        module, path = load_decorated_tests(self.get_auto_remove_tmp_dir())
        environment = {
            # The decorator reruns, in a pytest subprocess, the test that pytest says is running: this one of the file
            "PYTEST_CURRENT_TEST": f"{path}::DecoratedTest::{name} (call)",
            # The subprocess's options, and no plugin it does not ask for (a cheaper start)
            "PYTEST_ADDOPTS": addopts,
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        temporary_folder = self.get_auto_remove_tmp_dir()
        with mock.patch.dict(os.environ, environment), mock.patch.object(tempfile, "tempdir", temporary_folder):
            # Either, so that the wrong one fails this test instead of skipping it
            with self.assertRaises((pytest.skip.Exception, pytest.xfail.Exception)) as raised:
                getattr(module.DecoratedTest(name), name)()
            # The subprocess's variables stay out of this process's environment
            self.assertNotIn("_SUB_PROCESS_OUTCOME_FILE", os.environ)
        self.assertIsInstance(raised.exception, outcome)
        # Nothing of the decorator's is left behind
        self.assertEqual(os.listdir(temporary_folder), [])
        return raised.exception.msg

    def test_skipped(self):
        # Also without the JUnit XML plugin
        reason = self.check_outcome("test_skipped", pytest.skip.Exception, addopts="-p no:junitxml")
        # Where the test was skipped, in the subprocess
        line = DECORATED_TESTS.splitlines().index('        self.skipTest("skipped in the subprocess")') + 1
        self.assertTrue(reason.endswith(f"test_decorated.py:{line}: skipped in the subprocess"), reason)

    def test_xfailed(self):
        reason = self.check_outcome("test_xfailed", pytest.xfail.Exception)
        line = DECORATED_TESTS.splitlines().index('        pytest.xfail("xfailed in the subprocess")') + 1
        self.assertTrue(reason.endswith(f"test_decorated.py:{line}: xfailed in the subprocess"), reason)
