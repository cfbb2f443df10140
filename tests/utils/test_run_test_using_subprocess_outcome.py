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
from unittest import mock

import pytest
from packaging import version

from transformers.testing_utils import TestCasePlus, run_test_using_subprocess


# The tests `run_test_using_subprocess` runs in its subprocess
SUBPROCESS_TESTS = """
import unittest

import pytest


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


class RunTestUsingSubprocessOutcomeTest(TestCasePlus):
    def run_in_subprocess(self, test):
        """What `run_test_using_subprocess` raises (None: nothing) when it runs `test` of `SUBPROCESS_TESTS`."""
        path = os.path.join(self.get_auto_remove_tmp_dir(), "test_in_subprocess.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(SUBPROCESS_TESTS)
        # The test the decorator runs again in a subprocess is the one pytest is running (no plugins: a faster start)
        current_test = {"PYTEST_CURRENT_TEST": f"{path}::{test} (call)", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        with mock.patch.dict(os.environ, current_test):
            try:
                run_test_using_subprocess(lambda: None)()
            except (pytest.skip.Exception, pytest.xfail.Exception) as e:
                return path, e
        return path, None

    def test_skip_in_subprocess_is_reported(self):
        path, raised = self.run_in_subprocess("test_skip")
        self.assertIs(type(raised), pytest.skip.Exception)
        self.assertEqual(raised.msg, f"{path}:{SKIP_LINE}: skipped in the subprocess")

    def test_xfail_in_subprocess_is_reported(self):
        _, raised = self.run_in_subprocess("test_xfail")
        self.assertIs(type(raised), pytest.xfail.Exception)
        self.assertEqual(raised.msg, "xfailed in the subprocess")

    def test_partly_skipped_subtests_are_reported_as_pytest_reports_them(self):
        _, raised = self.run_in_subprocess("SubTests::test_one_subtest_skipped")
        # pytest 9 reports a test with only some of its subtests skipped as passed, earlier versions as skipped
        if version.parse(pytest.__version__).major >= 9:
            self.assertIsNone(raised)
        else:
            self.assertIs(type(raised), pytest.skip.Exception)
