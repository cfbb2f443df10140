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
`run_test_using_subprocess` end to end: a pytest run of decorated tests, each of which reruns itself in a pytest
subprocess, and the outcome the outer run reports for each.
"""

import os
import re
import subprocess
import sys
import unittest

import pytest
from packaging import version
from parameterized import parameterized

from transformers.testing_utils import SINGLE_PROCESS_DEVICES, TestCasePlus, torch_device


# Run by the outer pytest, and again, one test at a time, by the decorator's subprocess
DECORATED_TESTS = """
import os
import subprocess
import sys
import unittest

import pytest

from transformers.testing_utils import run_test_using_subprocess


class DecoratedTest(unittest.TestCase):
    @run_test_using_subprocess
    def test_passed(self):
        self.assertEqual(os.environ["_INSIDE_SUB_PROCESS"], "1")

    @run_test_using_subprocess
    def test_failed(self):
        self.fail("failed in the subprocess")

    @run_test_using_subprocess
    def test_skipped(self):
        self.skipTest("skipped in the subprocess")

    @run_test_using_subprocess
    def test_xfailed(self):
        pytest.xfail("xfailed in the subprocess")

    @run_test_using_subprocess
    def test_partly_skipped_subtests(self):
        for i in range(2):
            with self.subTest(i=i):
                if i == 0:
                    self.skipTest("one subtest skipped")


@run_test_using_subprocess
def test_skipped_with_pytestconfig(pytestconfig):
    # The subprocess gets this run's arguments, and a JUnit XML report to write only with the plugin on
    asked = any(arg.startswith("--junitxml") for arg in sys.argv)
    assert asked == (os.environ["_JUNITXML_EXPECTED"] == "1"), sys.argv
    pytest.skip("skipped in the subprocess")


def test_later_subprocess():
    code = "import os; print(os.environ.get('_INSIDE_SUB_PROCESS'), os.environ.get('CI'))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["None"] * 2
"""
OUTCOME = re.compile(r"^test_decorated\.py::(\S+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b", re.MULTILINE)
# pytest 9 reports a test with only some of its subtests skipped as passed, earlier versions as skipped
PARTLY_SKIPPED = "PASSED" if version.parse(pytest.__version__).major >= 9 else "SKIPPED"
WITHOUT_JUNITXML = ["DecoratedTest::test_skipped", "test_skipped_with_pytestconfig"]


@unittest.skipIf(torch_device in SINGLE_PROCESS_DEVICES, f"tests run in the same process on {torch_device}")
class RunTestUsingSubprocessTest(TestCasePlus):
    def run_pytest(self, *args, addopts="", ini_addopts="", junitxml_expected=True):
        """The outcome of each test of `DECORATED_TESTS` in a pytest run with `args`."""
        tmp_dir = self.get_auto_remove_tmp_dir()
        with open(os.path.join(tmp_dir, "test_decorated.py"), "w", encoding="utf-8") as f:
            f.write(DECORATED_TESTS)
        with open(os.path.join(tmp_dir, "pytest.ini"), "w", encoding="utf-8") as f:
            # The subprocesses too: no cache left here
            f.write(f"[pytest]\naddopts = -p no:cacheprovider {ini_addopts}\n")
        # Neither this run's options and plugins, nor the variables a subprocess of the decorator sets
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PYTEST_") and k not in ("CI", "_INSIDE_SUB_PROCESS")
        }
        env.update(
            PYTEST_ADDOPTS=addopts,
            PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
            PYTHONDONTWRITEBYTECODE="1",
            _JUNITXML_EXPECTED=str(int(junitxml_expected)),
        )
        command = [sys.executable, "-m", "pytest", "-v", "test_decorated.py", *args]
        result = subprocess.run(command, cwd=tmp_dir, env=env, capture_output=True, text=True)
        # The JUnit XML report of each subprocess was written into a temporary directory, not here
        self.assertEqual(sorted(os.listdir(tmp_dir)), ["pytest.ini", "test_decorated.py"])
        return dict(OUTCOME.findall(result.stdout)), result.stdout

    def test_outcomes(self):
        outcomes, output = self.run_pytest()
        expected = {
            "DecoratedTest::test_passed": "PASSED",
            "DecoratedTest::test_failed": "FAILED",
            "DecoratedTest::test_skipped": "SKIPPED",
            "DecoratedTest::test_xfailed": "XFAIL",
            "DecoratedTest::test_partly_skipped_subtests": PARTLY_SKIPPED,
            "test_skipped_with_pytestconfig": "SKIPPED",
            # The subprocesses' variables did not leak into the environment a later subprocess inherits
            "test_later_subprocess": "PASSED",
        }
        self.assertEqual(outcomes, expected, output)
        self.assertIn("(subprocess) AssertionError: failed in the subprocess", output)

    @parameterized.expand(
        [
            # A unittest test's subprocess gets none of the command's arguments (its report is asked for): left out
            ("command_line", ["-p", "no:junitxml"], {}, {}),
            ("command_line_joined", ["-pno:junitxml"], {}, {}),
            ("pytest_addopts", [], {"addopts": "-p no:junitxml"}, {"DecoratedTest::test_skipped": "PASSED"}),
            ("ini_addopts", [], {"ini_addopts": "-pno:junitxml"}, {"DecoratedTest::test_skipped": "PASSED"}),
        ]
    )
    def test_outcomes_without_junitxml(self, _, args, kwargs, unittest_outcome):
        # No report is asked for: a skip in the subprocess is read from its exit code, as a pass
        selected = ["-k", "test_skipped" if unittest_outcome else "test_skipped_with_pytestconfig"]
        outcomes, output = self.run_pytest(*args, *selected, junitxml_expected=False, **kwargs)
        self.assertEqual(outcomes, {"test_skipped_with_pytestconfig": "PASSED", **unittest_outcome}, output)
