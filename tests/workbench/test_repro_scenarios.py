"""Tests for utils/repro/scenarios.py: the byte-level tokenizer and the shipped prompts."""

import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from repro import scenarios  # noqa: E402


def test_encode_pads_and_truncates():
    ids, mask = scenarios.encode("ab", length=4)
    assert ids == [ord("a") + 1, ord("b") + 1, 0, 0]
    assert mask == [1, 1, 0, 0]
    ids, mask = scenarios.encode("é" * 10, length=4)  # bytes, not characters
    assert len(ids) == 4 and mask == [1, 1, 1, 1] and max(ids) <= 256


def test_prompts_are_shipped():
    prompts = scenarios.load_prompts()
    assert 24 <= len(prompts) <= 100
    assert all(prompt.strip() == prompt and prompt for prompt in prompts)
