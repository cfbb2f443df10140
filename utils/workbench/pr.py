"""PR output: one folder per PR of the stack under ``dist/`` (its ``git am`` series and PR_DESCRIPTION.md), the issue
drafts (``dist/issues/``), the texts outside the stack (``dist/outside-the-stack/``) and ``dist/README.md``, which tells
the submitter how all of it was made and what to do before opening anything. Authored by the contributor, written to a
staging folder and swapped in whole (never half-written)."""

import os
import shutil
import tempfile
from pathlib import Path

from .gitutil import ForkError, contributor_env, git
from .project import Project
from .stack import DEPS_TAG, PR, build_levels, changed_files, dependencies, doc_pages, level_ref, prs_of
from .texts import ISSUE_DIR, OUTSIDE_STACK, POLICY_URL, PR_DIR


MARKER = ".workbench-pr"
ISSUES_OUT = "issues"
OUTSIDE_OUT = "outside-the-stack"
# What dist/README.md tells the submitter before anything else.
PREAMBLE = f"""# Before you open anything

These patches, PR descriptions and issue drafts were produced with the help of automated tooling (a code agent), not
written by you. Transformers' Code Agent Policy ({POLICY_URL}, and the "Code Agent Policy" section of its PR template)
applies to every PR and issue opened from here: PRs that appear fully agent-written will probably be closed without
review. Take the same care with the accelerate PR. So, for each one you open:

1. Understand every changed line and every test, and be ready to defend them in review.
2. Apply the series to a clone of upstream's current main (`git am <folder>/*.patch`; they were made against the
   releases named below) and run its tests there yourself.
3. Rewrite the description or issue text in your own words; keep only what you checked. Tick the checklist items
   that are true for you, and answer the Code Agent Policy checkbox yourself: it is left unticked for you.
4. Where a folder below says "open the issue first", open that issue draft (from `{ISSUES_OUT}/`) first and wait for a
   maintainer's answer before opening the PR; link the issue from the PR.
"""


def toctree_entries(project: Project, prs: list[PR]) -> list[str]:
    """Lines telling which ``_toctree.yml`` entries to add by hand (the sdist has no docs tree to patch)."""
    lines = []
    for pr in prs:
        pages = doc_pages(project.upstreams[pr.upstream], pr)
        if pages:
            lines.append(f"PR {pr.folder} adds doc pages: in your clone, add to docs/source/en/_toctree.yml")
            lines.append("(in the section where the page belongs, e.g. next to the Trainer pages):")
            for local, title in pages:
                lines += [f"  - local: {local}", f"    title: {title}"]
    return lines


def write_stack(project: Project, prs: list[PR], staging: Path, name: str, email: str) -> list[str]:
    """Fill ``staging`` with one folder per PR; return the summary lines of dist/README.md."""
    env = contributor_env(name, email)
    summary = [
        PREAMBLE,
        "# The PR stack, in review order (bottom first)",
        "",
        f"Authored by {name} <{email}>. Each folder holds a `git am` series for its upstream at the given level",
        "(the pinned sdist, `git init`ed and committed, plus the series of the PRs it depends on, if any) and the",
        "PR's description.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="fork-pr-") as tmp:
        for upstream in project.upstreams.values():
            own = prs_of(prs, upstream)
            if not own:
                continue
            repo = build_levels(project, upstream, prs, Path(tmp) / upstream.name, env=env, reset_author=True)
            for pr in own:
                folder = staging / pr.folder
                folder.mkdir()
                start, end = DEPS_TAG + pr.name, level_ref(pr)
                git(
                    repo,
                    "format-patch",
                    "-q",
                    "--zero-commit",
                    "--full-index",
                    "--no-signature",
                    "--no-renames",
                    "-o",
                    str(folder),
                    f"{start}..{end}",
                    env=env,
                )
                text = (project.root / pr.description).read_text(encoding="utf-8")
                (folder / "PR_DESCRIPTION.md").write_text(text.rstrip() + "\n", encoding="utf-8")
                added, modified = changed_files(repo, start, end)
                below = [p.folder for p in dependencies(prs, pr)]
                summary += [
                    f"## {pr.folder}: {pr.title}",
                    "",
                    *(
                        [f"- **open the issue first**: `{ISSUES_OUT}/{Path(pr.issue_first).name}`; this PR follows it"]
                        if pr.issue_first
                        else []
                    ),
                    f"- upstream: {upstream.label}" + (f", on top of {', '.join(below)}" if below else " (pristine)"),
                    f"- depends on: {', '.join(pr.depends_on) or 'nothing'}",
                    f"- new files: {', '.join(added) or 'none'}",
                    f"- changed files: {', '.join(modified) or 'none'}",
                    f"- tests: {', '.join(pr.tests)}",
                    "",
                ]
    summary += write_texts(project, staging)
    toc = toctree_entries(project, prs)
    if toc:
        summary += ["## Doc pages to add to `_toctree.yml` by hand", "", "```", *toc, "```", ""]
    (staging / "README.md").write_text("\n".join(summary), encoding="utf-8")
    (staging / MARKER).write_text("written by `make pr`; replaced as a whole on the next run\n", encoding="utf-8")
    return toc


def write_texts(project: Project, staging: Path) -> list[str]:
    """Copy the issue drafts and the texts outside the stack; return their lines of dist/README.md."""
    lines = []
    issues = sorted((project.root / ISSUE_DIR).glob("*.md"))
    if issues:
        (staging / ISSUES_OUT).mkdir()
        lines += ["# Issue drafts", "", f"In `{ISSUES_OUT}/`, each to rewrite in your own words before opening:", ""]
        for path in issues:
            shutil.copyfile(path, staging / ISSUES_OUT / path.name)
            lines.append(f"- `{ISSUES_OUT}/{path.name}`: {first_heading(path)}")
        lines.append("")
    outside = [project.root / PR_DIR / f"{name}.md" for name in OUTSIDE_STACK]
    outside = [path for path in outside if path.is_file()]
    if outside:
        (staging / OUTSIDE_OUT).mkdir()
        lines += ["# Outside the stack", "", f"In `{OUTSIDE_OUT}/` (no patch series here):", ""]
        for path in outside:
            shutil.copyfile(path, staging / OUTSIDE_OUT / path.name)
            outside = OUTSIDE_STACK[path.stem]
            first = f"; **open the issue first**: `{ISSUES_OUT}/{outside.issue_first}`" if outside.issue_first else ""
            lines.append(f"- `{OUTSIDE_OUT}/{path.name}`: {outside.what}{first}")
        lines.append("")
    return lines


def first_heading(path: Path) -> str:
    """The first line of a text, without its heading marks (what the text is)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.lstrip("#").strip()
    return path.name


def ours(out: Path) -> bool:
    """Whether ``out`` may be replaced: missing, empty, or written by `make pr` (this or the one-series layout)."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    entries = list(out.iterdir())
    return (out / MARKER).exists() or all(
        e.name == "PR_DESCRIPTION.md" or (e.is_file() and e.suffix == ".patch") for e in entries
    )


def write_pr_output(project: Project, prs: list[PR], out: Path, name: str, email: str) -> list[str]:
    if not ours(out):
        raise ForkError(f"{out} exists and was not written by `make pr`; remove it or pass another --out folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
    try:
        toc = write_stack(project, prs, staging, name, email)
        os.chmod(staging, 0o755)
        if out.exists():
            trash = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            out.rename(trash / out.name)
            staging.rename(out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return toc
