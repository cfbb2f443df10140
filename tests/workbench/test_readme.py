"""The README and the workbench's own docstrings say what the code does (the facts a test can read back)."""

import dataclasses
import json
import re
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
import repro  # noqa: E402
from workbench.stack import PR  # noqa: E402


README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
STACK = json.loads((REPO_ROOT / "patches/stack.json").read_text(encoding="utf-8"))


def test_the_readme_lists_every_field_of_stack_json():
    fields = README[README.index("  Fields: `name`") :]
    fields = fields[: fields.index("\n\n")]
    keys = {f.name for f in dataclasses.fields(PR)} - {"position"}
    assert keys | {key for entry in STACK for key in entry} <= set(re.findall(r"`([a-z_]+)`", fields))


def test_the_readme_numbers_the_pr_of_the_upstream_test_edit_as_its_table_does():
    (position,) = [i for i, entry in enumerate(STACK, 1) if entry.get("upstream_test_patch")]
    table = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d) \| `([a-z0-9-]+)` \|", README, re.MULTILINE)}
    assert table[position] == STACK[position - 1]["name"]
    # The file the edit targets, in the row of its PR, and no other file named as JITCheckpointTest's home
    patch = (REPO_ROOT / STACK[position - 1]["upstream_test_patch"]).read_text(encoding="utf-8")
    (target,) = set(re.findall(r"^\+\+\+ b/(\S+)", patch, re.MULTILINE))
    row = re.search(rf"^\| {position} \| .*$", README, re.MULTILINE).group(0)
    assert "`JITCheckpointTest`" in row and f"`{target}`" in row
    assert "test_trainer_jit_checkpoint.py" not in README


def test_the_repro_docstring_says_the_missing_scaler_line_is_info():
    """The fork logs a checkpoint without scaler.pt at info level (as a missing RNG file); the end-to-end repro test
    checks the level."""
    text = " ".join(repro.__doc__.split())
    assert "an info line without `scaler.pt`" in text
    assert not re.search(r"warning without `scaler\.pt`", text)
