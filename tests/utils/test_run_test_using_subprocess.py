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
import subprocess
import sys
import unittest
from types import SimpleNamespace
from unittest import mock

import pytest
from packaging import version
from parameterized import parameterized

from transformers.testing_utils import SINGLE_PROCESS_DEVICES, TestCasePlus, run_test_using_subprocess, torch_device


# The tests `run_test_using_subprocess` runs again in its subprocess
SUBPROCESS_TESTS = """
import os
import unittest

import pytest


def test_env():
    assert os.environ["_INSIDE_SUB_PROCESS"] == "1"
    assert os.environ["_FROM_THE_PARENT"] == "1"


def test_skip():
    pytest.skip("skipped in the subprocess")


def test_xfail():
    pytest.xfail("xfailed in the subprocess")


class SubTests(unittest.TestCase):
    def test_one_subtest_skipped(self):
        for i in range(2):
            with self.subTest(i=i):
                if i == 0:
                    self.skipTest("one subtest skipped")
"""
SKIP_LINE = SUBPROCESS_TESTS.splitlines().index('    pytest.skip("skipped in the subprocess")') + 1


@unittest.skipIf(torch_device in SINGLE_PROCESS_DEVICES, f"tests run in the same process on {torch_device}")
class RunTestUsingSubprocessTest(TestCasePlus):
    def run_in_subprocess(self, test, pytest_addopts="", pytest_args=None):
        """
        What `run_test_using_subprocess` raises (None: nothing) when it runs `test` of `SUBPROCESS_TESTS`, as the
        current test, or as a test taking `pytestconfig` in a run with `pytest_args`.
        """
        path = os.path.join(self.get_auto_remove_tmp_dir(), "test_in_subprocess.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(SUBPROCESS_TESTS)
        kwargs = {}
        if pytest_args is not None:
            kwargs["pytestconfig"] = SimpleNamespace(
                invocation_params=SimpleNamespace(args=[*pytest_args, path]), args=[path]
            )
        # A function defined in that file: the decorator reruns the current test of `func.__globals__["__file__"]`
        func = eval("lambda **kwargs: None", {"__file__": path})
        # The subprocess loads no plugins (a faster start), and gets no option of this run's plugins
        env = {
            "PYTEST_CURRENT_TEST": f"{path}::{test} (call)",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTEST_ADDOPTS": pytest_addopts,
            "_FROM_THE_PARENT": "1",
        }
        with mock.patch.dict(os.environ, env):
            try:
                run_test_using_subprocess(func)(**kwargs)
            except (Exception, pytest.fail.Exception, pytest.skip.Exception) as e:
                return path, e
            # The subprocess's variables are not in the environment a later subprocess inherits
            code = "import os; print(os.environ.get('_INSIDE_SUB_PROCESS'))"
            output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            self.assertEqual(output.strip(), "None")
        return path, None

    def test_passed(self):
        self.assertIsNone(self.run_in_subprocess("test_env")[1])

    @parameterized.expand(
        [
            ("command_line", {"pytest_args": ["-p", "no:junitxml"]}),
            ("pytest_addopts", {"pytest_addopts": "-p no:junitxml"}),
        ]
    )
    def test_passed_without_junitxml(self, _, kwargs):
        self.assertIsNone(self.run_in_subprocess("test_env", **kwargs)[1])

    def test_skipped(self):
        path, raised = self.run_in_subprocess("test_skip")
        self.assertIs(type(raised), pytest.skip.Exception)
        self.assertEqual(raised.msg, f"{path}:{SKIP_LINE}: skipped in the subprocess")

    def test_xfailed(self):
        _, raised = self.run_in_subprocess("test_xfail")
        self.assertIs(type(raised), pytest.xfail.Exception)
        self.assertEqual(raised.msg, "xfailed in the subprocess")

    def test_partly_skipped_subtests(self):
        _, raised = self.run_in_subprocess("SubTests::test_one_subtest_skipped")
        # pytest 9 reports a test with only some of its subtests skipped as passed, earlier versions as skipped
        if version.parse(pytest.__version__).major >= 9:
            self.assertIsNone(raised)
        else:
            self.assertIs(type(raised), pytest.skip.Exception)
