"""Tests for the checks of the upstream-bound texts (utils/workbench/texts.py): on small texts in a fake project, and
on this repository's own PR descriptions and issue drafts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "utils"))
from workbench import pr, repros, texts  # noqa: E402
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
    upstream = {"package": "fakepkg", "version": "5.99.0", "sdist": "fakepkg-5.99.0.tar.gz", "sha256": "0" * 64}
    upstream.update(overlay=["tests/trainer"], patches="patches/transformers")
    config = {"upstreams": {"transformers": upstream}, "pins": {"torch": "2.13.0"}, "stack": "patches/stack.json"}
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
        "trainer-long": (GOOD.replace("Fixes a crash", long + " Fixes a crash"), "words of prose, more than 150"),
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
    good = {
        "claim": "Fixes a crash\n  when resuming",
        "evidence": "ran: python repro.py on {{transformers}} -> the crash",
    }
    write_text(project / "docs/pr/trainer-ok.md", text, [good, {**good, "evidence": "read: a/b@1 x.py:3 it says"}])
    write(project / "docs/pr/trainer-none.md", text)
    write(project / "docs/pr/trainer-bad.md", text)
    write(project / "docs/pr/trainer-bad.claims.json", "{not json")
    write_text(project / "docs/pr/trainer-empty.md", text, [])
    bad = [
        {"claim": "Fixes a bug", "evidence": "ran: x on {{transformers}} -> y"},
        {"claim": "Fixes a crash", "evidence": "it is so"},
        {"claim": "Fixes a crash", "evidence": "read:  "},
        {"evidence": "ran: x on {{transformers}} -> y"},
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


def test_a_ran_evidence_names_the_release_it_ran_on_and_no_evidence_a_path_of_the_machine(project):
    text = GOOD.replace("say workbench freely? no: the words", "the words")
    claim = "Fixes a crash"
    evidence = [
        "ran: python repro.py on {{transformers}} -> the crash",
        "ran: python repro.py on {{5.24.0}}, torch {{torch}} -> the crash",  # a release named on purpose
        "ran: python repro.py -> the crash",
        "ran: python repro.py on torch {{torch}} -> the crash",  # a tool, not the release it ran on
        "ran: python /tmp/x/repro.py on {{transformers}} -> the crash",
        "read: huggingface/transformers@v{{transformers}} src/x.py:1, copied to ~/notes: it says",
        "ran: /usr/bin/time python repro.py on {{transformers}}, <scratch tree>/tests -> https://x.org/tmp/y",
    ]
    write_text(project / "docs/pr/trainer-x.md", text, [{"claim": claim, "evidence": e} for e in evidence])
    where = "docs/pr/trainer-x.claims.json"
    release = "a 'ran:' names the release it ran on ({{transformers}}, {{accelerate}}, or {{X.Y.Z}} for a release on purpose)"
    path = "evidence holds a path of this machine ({!r}): name it relative to the repository or as <what it is>"
    assert problems(project) == [
        f"{where}, claim 3: {release}",
        f"{where}, claim 4: {release}",
        f"{where}, claim 5: " + path.format("/tmp/x/repro.py on {{transformers}} -> t"),
        f"{where}, claim 6: " + path.format("~/notes: it says"),
    ]


def test_a_description_whose_change_has_a_cuda_only_path_says_it_was_not_run_on_a_gpu(project):
    pr = {"name": "trainer-x", "upstream": "transformers", "description": "docs/pr/trainer-x.md"}
    write(project / "patches/stack.json", json.dumps([{**pr, "cuda_only": "a host read on CUDA"}]))
    text = GOOD.replace("say workbench freely? no: the words", "the words")
    write_text(project / "docs/pr/trainer-x.md", text)
    assert problems(project) == [
        "docs/pr/trainer-x.md: its change has a CUDA-only path (a host read on CUDA): say so on a line of its own, "
        f"{texts.NOT_RUN_ON_GPU!r} (`make open`'s GPU check replaces it with its result), or what it did on a GPU, "
        f"on a line starting {texts.RAN_ON_GPU!r}"
    ]
    said = text.replace("(#34053).\n", f"(#34053).\n{texts.NOT_RUN_ON_GPU}\n")
    write_text(project / "docs/pr/trainer-x.md", said)
    assert problems(project) == []
    assert texts.word_count(said) == texts.word_count(text)  # the line is not prose: the limit does not count it
    write_text(project / "docs/pr/trainer-x.md", said.replace(f"\n{texts.NOT_RUN_ON_GPU}", f" {texts.NOT_RUN_ON_GPU}"))
    assert len(problems(project)) == 1  # within a paragraph it is not the line that the GPU check replaces
    ran = text.replace(
        "(#34053).\n", f"(#34053).\n{texts.RAN_ON_GPU} (one NVIDIA H200): the accelerator variant passed.\n"
    )
    write_text(project / "docs/pr/trainer-x.md", ran)
    assert problems(project) == []  # once it ran, what it did there, on a line of its own
    assert texts.word_count(ran) == texts.word_count(text)
    write(project / "patches/stack.json", json.dumps([pr]))
    write_text(project / "docs/pr/trainer-x.md", text)
    assert problems(project) == []  # no CUDA-only path: no line


def test_a_comment_draft_is_held_to_the_comment_limit(project, monkeypatch):
    stem = "accelerate-9-comment"
    monkeypatch.setitem(texts.COMMENTS, stem, texts.Comment("huggingface/accelerate#9", "asks", "accelerate-x"))
    write_text(project / f"docs/issues/{stem}.md", "# Comment\n\n" + " ".join(["w"] * 250) + "\n")
    assert problems(project) == []
    write_text(project / f"docs/issues/{stem}.md", "# Comment\n\n" + " ".join(["w"] * 251) + "\n")
    assert problems(project) == [
        f"docs/issues/{stem}.md: 251 words of prose, more than {texts.COMMENT_WORDS} (code blocks not counted)"
    ]


def test_a_pr_description_is_held_to_150_words_and_one_reproduction(project):
    assert texts.PR_WORDS == 150
    good = GOOD.replace("say workbench freely? no: the words", "the words")
    prose = " ".join(["w"] * (150 - texts.word_count(good)))
    text = good.replace("Fixes a crash when resuming (#34053).", f"Fixes a crash when resuming (#34053). {prose}")
    write_text(project / "docs/pr/trainer-x.md", text)
    assert problems(project) == []
    write_text(project / "docs/pr/trainer-x.md", text.replace(" w w", " w w w", 1))
    assert problems(project) == ["docs/pr/trainer-x.md: 151 words of prose, more than 150 (code blocks not counted)"]
    second = text.replace("## Code Agent Policy", "```python\nprint(2)\n```\n\n## Code Agent Policy")
    write_text(project / "docs/pr/trainer-x.md", second)
    assert problems(project) == ["docs/pr/trainer-x.md: 2 reproductions (```python blocks), more than one"]


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


# --------------------------------------------------------------------------------------------------------------
# The pinned releases, named through placeholders


def test_placeholders_render_to_the_pins_in_checks_and_in_what_leaves_the_repository(project, tmp_path):
    body = "Fixes a crash on transformers {{transformers}} with torch {{torch}} (measured on {{5.24.0}}).\n"
    text = GOOD.replace("say workbench freely? no: the words", "the words").replace(
        "Fixes a crash when resuming", body
    )
    claim = {"claim": "transformers {{transformers}} with torch 2.13.0", "evidence": "ran: x on {{transformers}} -> y"}
    write_text(project / "docs/pr/trainer-x.md", text, [claim])
    assert problems(project) == []  # the claim matches the text once both are rendered
    loaded = load_project(project)
    assert "on transformers 5.99.0 with torch 2.13.0 (measured on 5.24.0)." in texts.render(
        text, texts.pinned_versions(loaded)
    )
    pr.write_rendered(loaded, project / "docs/pr/trainer-x.md", tmp_path / "PR_DESCRIPTION.md")
    shipped = (tmp_path / "PR_DESCRIPTION.md").read_text(encoding="utf-8")
    assert "transformers 5.99.0 with torch 2.13.0 (measured on 5.24.0)" in shipped and "{{" not in shipped
    assert texts.word_counts(loaded) == [("docs/pr/trainer-x.md", texts.word_count(shipped), texts.PR_WORDS)]
    # The reproductions' output markers are for `check` only: what leaves the repository has none
    write_text(project / "docs/issues/transformers-y.md", issue({"stock": "fixed: False in ."}))
    pr.write_rendered(loaded, project / "docs/issues/transformers-y.md", tmp_path / "y.md")
    shipped = (tmp_path / "y.md").read_text(encoding="utf-8")
    assert "<!--" not in shipped and "```\nfixed: False in .\n```" in shipped


def test_a_release_written_out_is_a_problem(project):
    text = "# Title\n\nOn 5.99.0, and on 1.15.0. Since 4.49, and on {{5.24.0}}, in `{{transfomers}}`.\n"
    write_text(project / "docs/issues/transformers-x.md", text, [{"claim": "On 5.99.0", "evidence": "read: x -> y"}])
    assert problems(project) == [
        "docs/issues/transformers-x.md: {{transfomers}} names no pin (known: transformers, torch; or {{X.Y.Z}} for a "
        "release on purpose)",
        "docs/issues/transformers-x.md: names the release 5.99.0 literally: write {{transformers}} for the pinned one, "
        "or {{5.99.0}} for this release on purpose (something measured on it and not re-run)",
        "docs/issues/transformers-x.md: names the release 1.15.0 literally: write {{transformers}} for the pinned one, "
        "or {{1.15.0}} for this release on purpose (something measured on it and not re-run)",
        "docs/issues/transformers-x.claims.json, claim 1: names the release 5.99.0 literally: write {{transformers}} "
        "for the pinned one, or {{5.99.0}} for this release on purpose (something measured on it and not re-run)",
    ]


# --------------------------------------------------------------------------------------------------------------
# Reproductions, run on stock and on the fork (repros.py)

SCRIPT = """```python
import os, sys, fakepkg
print("\\r 50%|#####     | 5/10\\r100%|##########| 10/10")
print("fixed:", fakepkg.FIXED, "in", os.getcwd(), "in 7.58s")
print("args:", sys.argv[1:])
```
"""


@pytest.fixture(scope="module")
def fake_venv(tmp_path_factory):
    """A virtual environment whose site-packages holds the "fork" (fakepkg.FIXED = True) through a .pth file, as an
    editable install does; beside it, the "stock" sources (FIXED = False)."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for name, fixed in (("fork", True), ("stock", False)):
        write(root / name / "src/fakepkg/__init__.py", f"FIXED = {fixed}\n")
    write(
        root / "stock/src/fakepkg/core.py",
        "class Core:\n    def step(self):\n        x = 1\n        return x\n\ny = 2\n",
    )
    write(Path(site) / "fakefork.pth", str(root / "fork/src") + "\n")
    return venv, root / "stock/src"


def verify(root: Path, fake_venv) -> tuple[list[str], str]:
    venv, stock = fake_venv
    return repros.verify_texts(load_project(root, None, venv), root / "tmp", {"transformers": stock})


def issue(shown: dict[str, str], script: str = SCRIPT) -> str:
    blocks = "".join(f"\n<!-- output: {variant} -->\n```\n{lines}\n```\n" for variant, lines in shown.items())
    return f"# Title\n\nA reproduction:\n\n{script}{blocks}"


def test_a_reproduction_that_prints_what_its_text_shows_passes(project, fake_venv):
    # progress bars, durations and the working folder left out; its other lines ignored
    write_text(project / "docs/issues/transformers-a.md", issue({"stock": "fixed: False in .\nargs: []"}))
    found, ok = verify(project, fake_venv)
    assert found == []
    assert ok.startswith("OK: texts: 1 reproduction(s) in 1 text(s) print what they show (1 run(s): 1 on the pinned")


def test_progress_bars_are_off_so_that_none_shares_a_line_with_a_print(project, fake_venv):
    script = '```python\nimport os\nprint("progress bars off:", os.environ.get("TQDM_DISABLE"))\n```\n'
    write_text(project / "docs/issues/transformers-t.md", issue({"stock": "progress bars off: 1"}, script))
    assert verify(project, fake_venv)[0] == []


def test_a_reproduction_runs_in_a_reviewers_shell_not_in_the_callers_environment(project, fake_venv, monkeypatch):
    # a CI runner's CI=true changes what run_test_using_subprocess's reproduction prints and stops pytest from cutting
    # its summary lines; make test exports RUN_SLOW
    for name, value in (("CI", "true"), ("BUILD_NUMBER", "7"), ("PYTEST_ADDOPTS", "-x"), ("RUN_SLOW", "1")):
        monkeypatch.setenv(name, value)
    names = "CI", "BUILD_NUMBER", "PYTEST_ADDOPTS", "RUN_SLOW", "HOME"
    script = f'```python\nimport os\nprint("seen:", *[os.environ.get(n) is not None for n in {names}])\n```\n'
    write_text(
        project / "docs/issues/transformers-e.md", issue({"stock": "seen: False False False False True"}, script)
    )
    assert verify(project, fake_venv)[0] == []


def test_a_reproduction_whose_output_changed_fails_naming_the_text_and_the_line(project, fake_venv):
    write_text(project / "docs/issues/transformers-b.md", issue({"stock": "fixed: True in .\nargs: []"}))
    write_text(project / "docs/issues/transformers-c.md", issue({"stock": "args: []\nfixed: False in ."}))  # order
    found, _ = verify(project, fake_venv)
    assert len(found) == 2
    assert found[0].startswith(
        "docs/issues/transformers-b.md, line 12: the reproduction no longer prints what the text shows on the pinned "
        "fakepkg 5.99.0: shown line 1, 'fixed: True in .', is not printed (in that order); the closest printed line: "
        "'fixed: False in .'; exit status 0"
    ), found
    assert found[1].startswith(
        "docs/issues/transformers-c.md, line 12: the reproduction no longer prints what the text"
    )
    assert "shown line 2, 'fixed: False in .', is not printed (in that order)" in found[1]


def test_before_and_after_the_fix_each_run_compared_with_its_block(project, fake_venv):
    fixed = issue({"stock": "fixed: False in .", "fork": "fixed: True in ."})
    command = SCRIPT.replace("```python\n", "```python\n# check.py, run with `python check.py --flag`\n")
    write_text(project / "docs/pr/trainer-x.md", GOOD.replace("say workbench freely? no: the words", "the words"))
    write_text(project / "docs/issues/transformers-c.md", fixed)
    write_text(project / "docs/issues/transformers-d.md", issue({"fork": "args: ['--flag']"}, command))
    found, ok = verify(project, fake_venv)
    assert found == []
    assert "2 reproduction(s) in 2 text(s) print what they show (3 run(s): 1 on the pinned fakepkg 5.99.0, 2 on" in ok

    write_text(project / "docs/issues/transformers-c.md", issue({"stock": "fixed: True in .", "fork": "fixed: False"}))
    found, _ = verify(project, fake_venv)
    assert [p.split(": the reproduction")[0] for p in found] == [
        "docs/issues/transformers-c.md, line 12",
        "docs/issues/transformers-c.md, line 17",
    ]
    assert "on the pinned fakepkg 5.99.0: shown line 1, 'fixed: True in .'" in found[0]
    assert "on the fork: shown line 1, 'fixed: False'" in found[1]


def test_markers_must_name_a_variant_above_a_plain_block_below_a_script(project, fake_venv, monkeypatch):
    text = (
        issue({"stock": "fixed: False in ."})
        + "\n<!-- output: fixed -->\n```\nx\n```\n<!-- output: fork -->\nno block\n"
    )
    write_text(project / "docs/issues/transformers-e.md", text)
    write_text(project / "docs/issues/transformers-f.md", "# Title\n\n<!-- output: stock -->\n```\nx\n```\n")
    write_text(project / "docs/issues/transformers-g.md", "# T\n\n```python\nprint('a sketch, not run')\n```\n")
    monkeypatch.setattr(repros, "REPRO_TIMEOUT", 1)
    write_text(
        project / "docs/issues/transformers-h.md",
        issue({"stock": "x"}, "```python\nimport time\ntime.sleep(60)\n```\n"),
    )
    found, _ = verify(project, fake_venv)
    assert found == [
        "docs/issues/transformers-e.md, line 17: output 'fixed' is none of stock, fork",
        "docs/issues/transformers-e.md, line 21: the marker must stand right above a plain ``` block",
        "docs/issues/transformers-f.md, line 3: no ```python block above this output",
        "docs/issues/transformers-h.md, line 10: the reproduction ran past 1 s on the pinned fakepkg 5.99.0",
    ]


def test_read_evidence_at_the_pinned_version_is_found_again(project, fake_venv):
    def read(where: str) -> dict:
        return {"claim": "# Title", "evidence": f"read: huggingface/transformers@v{{{{transformers}}}} {where}"}

    good = [read('src/fakepkg/core.py:Core.step "x = 1 return x" (the step)'), read('src/fakepkg/core.py "y = 2"')]
    write_text(
        project / "docs/issues/transformers-r.md",
        "# Title\n",
        [*good, {"claim": "# Title", "evidence": "read: a/b@1.0 x.py:3 old"}],
    )
    assert verify(project, fake_venv)[1].endswith(
        "2 read: quote(s) found in the pinned sources (1 other read: evidence not re-checked)"
    )
    bad = [
        read('src/fakepkg/core.py:Core.step "y = 2"'),
        read('src/fakepkg/core.py:Core.stop "x = 1"'),
        read('src/fakepkg/gone.py "x"'),
        read('src/fakepkg/core.py "x = 3"'),
        read("src/fakepkg/core.py:12 x = 1"),
    ]
    write_text(project / "docs/issues/transformers-r.md", "# Title\n", bad)
    where = "docs/issues/transformers-r.claims.json, claim"
    assert verify(project, fake_venv)[0] == [
        f"{where} 1: src/fakepkg/core.py, Core.step of transformers 5.99.0 does not say 'y = 2'",
        f"{where} 2: src/fakepkg/core.py of transformers 5.99.0 defines no Core.stop",
        f"{where} 3: src/fakepkg/gone.py is not in transformers 5.99.0",
        f"{where} 4: src/fakepkg/core.py of transformers 5.99.0 does not say 'x = 3'",
        f'{where} 5: a read: at the pinned version must say <path>[:<function>] "<quoted text>"',
    ]


def test_ctrl_c_during_a_reproduction_ends_it(project, fake_venv, tmp_path):
    """A reproduction runs in a session of its own (a timeout ends all it started), which Ctrl-C does not reach: an
    interrupted check ends it at once rather than waiting for it."""
    pid_file, finished = tmp_path / "pid", tmp_path / "finished"
    script = (
        "```python\nimport os, signal, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "os.kill(os.getppid(), signal.SIGINT)\n"  # Ctrl-C reaches the check, not this session
        f"time.sleep(30)\nopen({str(finished)!r}, 'w').close()\n```\n"
    )
    write_text(project / "docs/issues/transformers-a.md", issue({"stock": "x"}, script))
    with pytest.raises(KeyboardInterrupt):
        verify(project, fake_venv)
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(int(pid_file.read_text(encoding="utf-8")), 0)
    assert not finished.exists()  # ended by the interrupted check, not by running to its end
