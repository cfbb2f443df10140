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
from parameterized import parameterized

from transformers.testing_utils import TestCasePlus, run_test_using_subprocess


# The tests `run_test_using_subprocess` runs in its subprocess
SUBPROCESS_TESTS = """
import pytest


def test_skip():
    pytest.skip("skipped in the subprocess")


def test_xfail():
    pytest.xfail("xfailed in the subprocess")
"""


class RunTestUsingSubprocessOutcomeTest(TestCasePlus):
    @parameterized.expand(
        [
            ("skip", pytest.skip.Exception, "skipped in the subprocess"),
            ("xfail", pytest.xfail.Exception, "xfailed in the subprocess"),
        ]
    )
    def test_outcome_in_subprocess_is_reported(self, outcome, exception, reason):
        path = os.path.join(self.get_auto_remove_tmp_dir(), "test_in_subprocess.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(SUBPROCESS_TESTS)
        # The test the decorator runs again in a subprocess is the one pytest is running (no plugins: a faster start)
        current_test = {"PYTEST_CURRENT_TEST": f"{path}::test_{outcome} (call)", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        with mock.patch.dict(os.environ, current_test), self.assertRaises(exception) as context:
            run_test_using_subprocess(lambda: None)()
        self.assertEqual(context.exception.msg, reason)
