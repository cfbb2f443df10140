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
"""`run_test_using_subprocess` sets its subprocess's variables for that subprocess only."""

import json
import os
import subprocess
import sys
import unittest
from unittest import mock

from transformers.testing_utils import SINGLE_PROCESS_DEVICES, run_test_using_subprocess, torch_device


VARIABLES = ("_INSIDE_SUB_PROCESS", "CI")
PRINT_VARIABLES = f"import json, os; print(json.dumps([os.environ.get(name) for name in {VARIABLES!r}]))"


def restore_environment(values):
    """Sets the variables back, also in the process's environment where `os.environ` does not show a change."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
            os.unsetenv(name)
        else:
            os.environ[name] = value


@unittest.skipIf(
    os.getenv("_INSIDE_SUB_PROCESS") == "1" or torch_device in SINGLE_PROCESS_DEVICES,
    "the decorator runs the test in this process",
)
class RunTestUsingSubprocessEnvironmentTest(unittest.TestCase):
    def test_a_later_subprocess_does_not_inherit_the_variables(self):
        before = [os.environ.get(name) for name in VARIABLES]
        self.addCleanup(restore_environment, dict(zip(VARIABLES, before)))

        @run_test_using_subprocess
        def decorated():
            pass

        # The decorator's own pytest subprocess is not started: what it would inherit is what is checked
        with mock.patch("subprocess.run") as run:
            decorated()
        self.assertEqual(run.call_args.kwargs["env"]["_INSIDE_SUB_PROCESS"], "1")

        later = subprocess.run([sys.executable, "-c", PRINT_VARIABLES], capture_output=True, text=True, check=True)
        self.assertEqual(json.loads(later.stdout), before)
