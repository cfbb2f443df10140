"""Tests for utils/upstream_pins.py: upstream's pytest pins are read from the fork's setup.py, never guessed."""

import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
import upstream_pins  # noqa: E402


SETUP_PY = """
from setuptools import setup

_deps = [
    "numpy>=1.17",
    "deepspeed>=0.9.3",
    "pytest>=7.2.0,<9.0.0",
    "pytest-asyncio>=1.2.0",
    "pytest-random-order",
    "pytest-rerunfailures<16.0",
    "pytest-timeout",
    "pytest-xdist",
    "pytest-order",
]
"""


def write(tmp_path, text):
    path = tmp_path / "setup.py"
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_the_specs_in_package_order(tmp_path):
    specs = upstream_pins.upstream_specs(write(tmp_path, SETUP_PY))
    assert specs == [
        "pytest>=7.2.0,<9.0.0",
        "pytest-xdist",
        "pytest-random-order",
        "pytest-rerunfailures<16.0",
        "pytest-timeout",
        "pytest-order",
    ]


def test_reads_an_extra_package(tmp_path):
    # `--extra deepspeed`: upstream's spec, not a guess written here; an unknown name is a clear error.
    assert upstream_pins.upstream_specs(write(tmp_path, SETUP_PY), ["deepspeed"]) == ["deepspeed>=0.9.3"]
    with pytest.raises(upstream_pins.PinsError, match="does not pin nosuchpackage"):
        upstream_pins.upstream_specs(write(tmp_path, SETUP_PY), ["nosuchpackage"])


def test_reads_the_built_fork(tmp_path):
    setup_py = REPO_ROOT / "build" / "transformers" / "setup.py"
    if not setup_py.is_file():
        pytest.skip("no built fork (make fork)")
    assert upstream_pins.upstream_specs(setup_py)[0].startswith("pytest")


@pytest.mark.parametrize(
    "text, message",
    [
        (SETUP_PY.replace('    "pytest-timeout",\n', ""), "does not pin pytest-timeout"),
        ("from setuptools import setup\n", "has no `_deps` list"),
    ],
)
def test_clear_errors(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(upstream_pins.PinsError, match=message) as error:
        upstream_pins.upstream_specs(path)
    assert str(path) in str(error.value)


def test_missing_fork_is_named(tmp_path):
    with pytest.raises(upstream_pins.PinsError, match="run `make fork` first"):
        upstream_pins.upstream_specs(tmp_path / "setup.py")
