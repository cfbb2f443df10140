"""Tests for the checks of the upstream-bound texts (utils/workbench/texts.py): on small texts in a fake project, and
on this repository's own PR descriptions and issue drafts."""

import json
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from workbench import texts  # noqa: E402
from workbench.project import load_project  # noqa: E402


POLICY = texts.POLICY_URL
GOOD = f"""# What does this PR do?

Fixes a crash when resuming (#34053).

```python
print("code blocks are not prose, and say workbench freely? no: the words are checked everywhere")
```

## Code Agent Policy

Policy: [CONTRIBUTING.md]({POLICY}).

- [ ] I confirm that this is not a pure code agent PR.

## Before submitting
- [ ] Did you make sure to update the documentation with your changes?
- [x] Did you write any new necessary tests?

## Who can review?

@SunMarc
"""
REFERENCE = {
    "repo": "huggingface/transformers",
    "number": 34053,
    "kind": "issue",
    "title": "t",
    "state": "closed",
    "looked_up": "2026-12-01",
}


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "repo"
    upstream = {"package": "fakepkg", "version": "1.0", "sdist": "fakepkg-1.0.tar.gz", "sha256": "0" * 64}
    upstream.update(overlay=["tests/trainer"], patches="patches/transformers")
    config = {"upstreams": {"transformers": upstream}, "pins": {}, "stack": "patches/stack.json"}
    write(root / "patches/config.json", json.dumps(config))
    write(root / "patches/stack.json", json.dumps([]))
    write(root / "docs/references.json", json.dumps({"references": [REFERENCE]}))
    return root


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_text(path: Path, text: str, claims: list[dict] | None = None) -> None:
    """An upstream-bound text and its claims file beside it (by default: its first line, read somewhere)."""
    write(path, text)
    if claims is None:
        claims = [{"claim": text.splitlines()[0], "evidence": "read: owner/repo@1.0 src/x.py:1 says so"}]
    write(texts.claims_path(path), json.dumps({"claims": claims}))


def problems(root: Path) -> list[str]:
    return texts.text_problems(load_project(root))


def test_word_count_leaves_out_code_comments_headings_and_checklists():
    text = "# Title here\n\nOne two three.\n\n```\nnot counted at all\n```\n<!-- nor this -->\n- [ ] nor\n  this\n"
    assert texts.word_count(text) == 3
    assert texts.word_count("See [the policy](https://example.com/a/b) now.") == 4


def test_a_description_in_the_current_template_passes(project):
    write_text(project / "docs/pr/trainer-x.md", GOOD.replace("say workbench freely? no: the words", "the words"))
    assert problems(project) == []


def test_each_rule_is_enforced(project):
    long = " ".join(["word"] * 251)
    cases = {
        "trainer-long": (GOOD.replace("Fixes a crash", long + " Fixes a crash"), "words of prose, more than 250"),
        "trainer-words": (GOOD, "says 'workbench'"),
        "trainer-make": (GOOD.replace("Fixes", "Run make pr. Fixes"), "says 'make'"),
        "trainer-folder": (GOOD.replace("Fixes", "See utils/repro.py. Fixes"), "says 'utils/'"),
        "trainer-placeholder": (GOOD.replace("(#34053)", "(#<PR x>)"), "holds a '#<' placeholder"),
        "trainer-cite": (GOOD.replace("#34053", "#1"), "cites huggingface/transformers#1, which is not in"),
        "trainer-order": (GOOD.replace("## Before submitting", "## Before you submit"), "the sections must be"),
        "trainer-ticked": (GOOD.replace("- [ ] I confirm", "- [x] I confirm"), "checkbox is the submitter's"),
        "trainer-copied": (GOOD.replace("Policy: ", "We are overwhelmed by a large number of PRs. "), "copies"),
        "trainer-repro": (
            GOOD.replace("print(", "x = 1\n" * 30 + "print("),
            "a reproduction of 31 lines, more than 30",
        ),
        "trainer-reviewers": (GOOD.replace("@SunMarc", "@a @b @c"), "tags 3 reviewers"),
    }
    for name, (text, _) in cases.items():
        write_text(project / f"docs/pr/{name}.md", text.replace("say workbench freely? no: the words", "the words"))
    (project / "docs/pr/trainer-words.md").write_text(GOOD, encoding="utf-8")
    found = problems(project)
    for name, (_, expected) in cases.items():
        assert any(p.startswith(f"docs/pr/{name}.md: ") and expected in p for p in found), (name, found)
    assert len(found) == len(cases)


def test_whole_words_only_and_the_templates_own_make_sure(project):
    text = GOOD.replace(
        "say workbench freely? no: the words", "the restored words, a sessionless, tests/utils/"
    ).replace("Fixes", "Make sure it is restored. Fixes")
    write_text(project / "docs/pr/trainer-x.md", text)
    assert problems(project) == []


def test_accelerate_template_and_issue_drafts(project):
    body = GOOD.replace("say workbench freely? no: the words", "the words").replace("(#34053)", "(#4242)")
    accelerate = body.replace(f"## Code Agent Policy\n\nPolicy: [CONTRIBUTING.md]({POLICY}).\n\n", "").replace(
        "- [ ] I confirm that this is not a pure code agent PR.\n\n", ""
    )
    write_text(project / "docs/pr/accelerate-x.md", accelerate)
    write_text(
        project / "docs/issues/transformers-x.md",
        "# Title\n\n" + " ".join(["w"] * 301) + " huggingface/accelerate#7\n",
    )
    write_text(project / "docs/issues/other.md", "# Title\n\nText.\n")
    found = problems(project)
    assert "docs/pr/accelerate-x.md: cites huggingface/accelerate#4242, which is not in" in found[0]
    assert any("transformers-x.md: 303 words of prose, more than 300" in p for p in found), found
    assert any("transformers-x.md: cites huggingface/accelerate#7" in p for p in found), found
    assert any("other.md: name it after its repository" in p for p in found), found
    assert len(found) == 4


def test_each_claim_has_its_evidence_beside_the_text(project):
    text = GOOD.replace("say workbench freely? no: the words", "the words")
    good = {"claim": "Fixes a crash\n  when resuming", "evidence": "ran: python repro.py on 5.24.0 -> the crash"}
    write_text(project / "docs/pr/trainer-ok.md", text, [good, {**good, "evidence": "read: a/b@1 x.py:3 it says"}])
    write(project / "docs/pr/trainer-none.md", text)
    write(project / "docs/pr/trainer-bad.md", text)
    write(project / "docs/pr/trainer-bad.claims.json", "{not json")
    write_text(project / "docs/pr/trainer-empty.md", text, [])
    bad = [
        {"claim": "Fixes a bug", "evidence": "ran: x -> y"},
        {"claim": "Fixes a crash", "evidence": "it is so"},
        {"claim": "Fixes a crash", "evidence": "read:  "},
        {"evidence": "ran: x -> y"},
    ]
    write_text(project / "docs/pr/trainer-wrong.md", text, bad)
    write(project / "docs/issues/transformers-gone.claims.json", json.dumps({"claims": [good]}))
    assert problems(project) == [
        "docs/pr/trainer-bad.claims.json is not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
        'docs/pr/trainer-empty.claims.json must hold {"claims": [...]} with at least one claim',
        "docs/pr/trainer-none.md: no docs/pr/trainer-none.claims.json (each factual sentence with what was run or "
        "read to show it)",
        "docs/pr/trainer-wrong.claims.json, claim 1: docs/pr/trainer-wrong.md does not say 'Fixes a bug'",
        "docs/pr/trainer-wrong.claims.json, claim 2: evidence must say 'ran: <command> -> <output>' or 'read: <source>'",
        "docs/pr/trainer-wrong.claims.json, claim 3: evidence must say 'ran: <command> -> <output>' or 'read: <source>'",
        "docs/pr/trainer-wrong.claims.json, claim 4: no claim",
        "docs/issues/transformers-gone.claims.json: its text transformers-gone.md does not exist",
    ]


def test_a_comment_draft_is_held_to_the_comment_limit(project, monkeypatch):
    stem = "accelerate-9-comment"
    monkeypatch.setitem(texts.COMMENTS, stem, texts.Comment("huggingface/accelerate#9", "asks", "accelerate-x"))
    write_text(project / f"docs/issues/{stem}.md", "# Comment\n\n" + " ".join(["w"] * 250) + "\n")
    assert problems(project) == []
    write_text(project / f"docs/issues/{stem}.md", "# Comment\n\n" + " ".join(["w"] * 251) + "\n")
    assert problems(project) == [
        f"docs/issues/{stem}.md: 251 words of prose, more than {texts.COMMENT_WORDS} (code blocks not counted)"
    ]


def test_references_must_say_what_was_found(project):
    write(project / "docs/references.json", json.dumps({"references": [{**REFERENCE, "state": "", "kind": "bug"}]}))
    found = problems(project)
    assert found == ["docs/references.json, entry 1: missing state"]


def test_this_repositorys_texts_pass_the_checks():
    project = load_project(REPO_ROOT)
    assert texts.text_problems(project) == []
    counted = {path: (words, limit) for path, words, limit in texts.word_counts(project)}
    assert all(words <= limit for words, limit in counted.values())
    assert len([p for p in counted if p.startswith("docs/issues/")]) >= 3
