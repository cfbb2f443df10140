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
from unittest import mock

from transformers.testing_utils import TestCasePlus, run_test_using_subprocess


class RunTestUsingSubprocessEnvironmentTest(TestCasePlus):
    def test_subprocess_environment_does_not_leak(self):
        path = os.path.join(self.get_auto_remove_tmp_dir(), "test_in_subprocess.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                "import os\n\n\ndef test_env():\n"
                "    assert os.environ['_INSIDE_SUB_PROCESS'] == '1'\n"
                "    assert os.environ['_FROM_THE_PARENT'] == '1'\n"
            )
        # The test the decorator runs again in a subprocess is the one pytest is running (no plugins: a faster start),
        # and a variable the subprocess inherits
        current_test = {
            "PYTEST_CURRENT_TEST": f"{path}::test_env (call)",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "_FROM_THE_PARENT": "1",
        }
        with mock.patch.dict(os.environ, current_test):
            run_test_using_subprocess(lambda: None)()

            # Checked before `mock.patch.dict` restores `os.environ`: the variables of the decorator's subprocess are
            # neither in `os.environ` nor in the environment a later subprocess inherits
            self.assertNotIn("_INSIDE_SUB_PROCESS", os.environ)
            code = "import os; print(os.environ.get('_INSIDE_SUB_PROCESS'))"
            output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        self.assertEqual(output.strip(), "None")
