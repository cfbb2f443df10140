"""PR output: one folder per PR of the stack under ``dist/`` (its ``git am`` series, PR_DESCRIPTION.md and, where the PR
edits an existing upstream test file, that edit as a patch for a clone of upstream main), the issue drafts and comments
(``dist/issues/``), the texts outside the stack (``dist/outside-the-stack/``) and ``dist/README.md``, which tells the
submitter how all of it was made, what to do before opening anything, and the plan: what to open in which order, each
step with what it waits for. Authored by the contributor, written to a
staging folder and swapped in whole (never half-written)."""

import os
import re
import shutil
import tempfile
from pathlib import Path

from .gitutil import ForkError, contributor_env, git
from .project import Project
from .repros import MARKER as OUTPUT_MARKER
from .stack import DEPS_TAG, PR, build_levels, changed_files, dependencies, doc_pages, level_ref, prs_of
from .texts import (
    COMMENTS,
    ISSUE_DIR,
    LEFT_OUT,
    NOT_RUN_ON_GPU,
    OUTSIDE_STACK,
    POLICY_URL,
    PR_DIR,
    Comment,
    pinned_versions,
    render,
)


MARKER = ".workbench-pr"
ISSUES_OUT = "issues"
OUTSIDE_OUT = "outside-the-stack"
UPSTREAM_TEST_OUT = "upstream-test"  # beside the series, not among its *.patch files (`git am <folder>/*.patch`)
# What dist/README.md tells the submitter before anything else.
PREAMBLE = f"""# Before you open anything

These patches, PR descriptions and issue drafts were produced with the help of automated tooling (a code agent), not
written by you. Transformers' Code Agent Policy ({POLICY_URL}, and the "Code Agent Policy" section of its PR template)
applies to every PR and issue opened from here: PRs that appear fully agent-written will probably be closed without
review. Take the same care with the accelerate PR. So, for each one you open:

1. Understand every changed line and every test, and be ready to defend them in review.
2. Prove it on a clone of upstream's current main (the series were made on the releases named below): in the
   workbench, `make open CLONE=<your clone> PR=<name>` makes the PR's branch from your clone's main (authored by
   you, three-way), runs its tests with and without its fix there, upstream's `tests/trainer` on main and on the
   branch, and, on a machine with CUDA, the GPU check (`bench/gpu_check.py`, whose summary replaces the line
   "{NOT_RUN_ON_GPU}" in the descriptions here of the PRs with a CUDA-only path). Open a PR only where it says
   "ready to push"; it never pushes.
3. Rewrite the description or issue text in your own words; keep only what you checked. Tick the checklist items
   that are true for you, and answer the Code Agent Policy checkbox yourself: it is left unticked for you.
4. Follow the plan below, one step at a time: a step waits for what it names (a comment or issue answered by a
   maintainer, a PR merged). Link the issue or comment a PR follows from the PR.
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


def comments(project: Project) -> dict[str, Comment]:
    """The registered comments (texts.COMMENTS) whose draft exists, by file stem."""
    return {stem: c for stem, c in COMMENTS.items() if (project.root / ISSUE_DIR / f"{stem}.md").is_file()}


def waits_for(project: Project, prs: list[PR], pr: PR) -> list[str]:
    """What a PR waits for before it is opened: a comment answered, its issue answered, the PRs it applies on, and
    the previous PR of the stack in the same upstream reviewed (one of ours open at a time in each repository)."""
    waits = [
        f"{c.answer or f'an answer to the comment on {c.on}'} (`{ISSUES_OUT}/{stem}.md`)"
        for stem, c in comments(project).items()
        if c.before == pr.name
    ]
    if pr.issue_first:
        waits.append(f"an answer to the issue `{ISSUES_OUT}/{Path(pr.issue_first).name}` (open it first)")
    by_name = {p.name: p for p in prs}
    waits += [f"{by_name[dep].folder} merged (this PR applies on top of it)" for dep in pr.depends_on]
    same_upstream = [p for p in prs if p.upstream == pr.upstream]
    previous = same_upstream[same_upstream.index(pr) - 1] if same_upstream.index(pr) else None
    if previous is not None and previous.name not in pr.depends_on:
        waits.append(f"`{previous.folder}` reviewed by a maintainer (one of these PRs open at a time)")
    return waits


def plan(project: Project, prs: list[PR]) -> list[str]:
    """The plan of dist/README.md: the comments first, then the PRs in stack order, then what no PR waits for."""
    steps = [
        f"Post `{ISSUES_OUT}/{stem}.md` as a comment on {c.on}: it {c.what}. Waits for nothing."
        for stem, c in comments(project).items()
    ]
    for pr in prs:
        waits = waits_for(project, prs, pr)
        steps.append(
            f"Open `{pr.folder}` ({pr.upstream}) once `make open CLONE=../{pr.upstream} PR={pr.name}` says it is ready "
            "to push. Waits for " + ("; ".join(waits) or "nothing") + "."
        )
    waited = {Path(pr.issue_first).name for pr in prs if pr.issue_first} | {f"{s}.md" for s in COMMENTS}
    waited |= {o.issue_first for o in OUTSIDE_STACK.values() if o.issue_first}
    left_out, later = [], []
    for path in sorted((project.root / ISSUE_DIR).glob("*.md")):
        rel = f"{ISSUE_DIR}/{path.name}"
        if rel in LEFT_OUT:
            left_out.append(f"Not in dist/: `{rel}` (an issue draft): {LEFT_OUT[rel]}.")
        elif path.name not in waited:
            later.append(f"Open the issue `{ISSUES_OUT}/{path.name}`.")
    for stem, outside in OUTSIDE_STACK.items():
        rel = f"{PR_DIR}/{stem}.md"
        if not (project.root / rel).is_file():
            continue
        if rel in LEFT_OUT:
            left_out.append(f"Not in dist/: `{rel}` ({outside.what}): {LEFT_OUT[rel]}.")
            continue
        if outside.issue_first and (project.root / ISSUE_DIR / outside.issue_first).is_file():
            later.append(f"Open the issue `{ISSUES_OUT}/{outside.issue_first}`.")
            waits = f"an answer to the issue `{ISSUES_OUT}/{outside.issue_first}`"
        else:
            waits = "nothing more"
        later.append(f"Open `{OUTSIDE_OUT}/{stem}.md` ({outside.what}). Waits for {waits}.")
    lines = ["# The plan: what to open, in what order", ""]
    lines += [f"{i}. {step}" for i, step in enumerate(steps, 1)]
    if later:
        lines += ["", "Not in this plan: after the PRs above are merged, one at a time:", ""]
        lines += [f"- {step}" for step in later]
    return lines + ["", *left_out, *([""] if left_out else [])]


def authored(patch: bytes, name: str, email: str) -> bytes:
    """A ``git format-patch`` file with its ``From:`` header (which may wrap, as ``Subject:`` does for
    ``series.patch_subject``) naming the contributor; the rest byte for byte. A plain diff has nobody to rename."""
    head, sep, body = patch.partition(b"\n\n")
    author = f"From: {name} <{email}>".encode()
    return re.sub(rb"^From: .*(?:\n[ \t].*)*", lambda _: author, head, count=1, flags=re.MULTILINE) + sep + body


def write_stack(project: Project, prs: list[PR], staging: Path, name: str, email: str) -> list[str]:
    """Fill ``staging`` with one folder per PR; return the summary lines of dist/README.md."""
    env = contributor_env(name, email)
    summary = [
        PREAMBLE,
        *plan(project, prs),
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
                write_rendered(project, project.root / pr.description, folder / "PR_DESCRIPTION.md")
                added, modified = changed_files(repo, start, end)
                below = [p.folder for p in dependencies(prs, pr)]
                test_patch = []
                if pr.upstream_test_patch:
                    source = project.root / pr.upstream_test_patch
                    shipped = f"{pr.folder}/{UPSTREAM_TEST_OUT}/{source.name}"
                    (folder / UPSTREAM_TEST_OUT).mkdir()
                    (staging / shipped).write_bytes(authored(source.read_bytes(), name, email))
                    test_patch = [
                        f"- edit to an existing upstream test file: `{shipped}` (upstream's tests/ tree is not in the "
                        "sdist). `make open` applies it to upstream's file in place of the PR's new test file where "
                        "your clone has that file; by hand: In your clone of upstream main, on the same branch, after "
                        f"the series: `git am {shipped}`, one more commit of this PR"
                    ]
                summary += [
                    f"## {pr.folder}: {pr.title}",
                    "",
                    *(
                        [f"- **open the issue first**: `{ISSUES_OUT}/{Path(pr.issue_first).name}`; this PR follows it"]
                        if pr.issue_first
                        else []
                    ),
                    f"- made on: {upstream.label}, the pinned release's sdist"
                    + (f", on top of {', '.join(below)}" if below else " (pristine)")
                    + f"; before opening: `make open CLONE=../{upstream.name} PR={pr.name}` on your clone of main",
                    f"- depends on: {', '.join(pr.depends_on) or 'nothing'}",
                    f"- new files: {', '.join(added) or 'none'}",
                    f"- changed files: {', '.join(modified) or 'none'}",
                    f"- tests: {', '.join(pr.tests)}",
                    *([f"- where its tests belong upstream: `{pr.belongs_in}`"] if pr.belongs_in else []),
                    *test_patch,
                    "",
                ]
    summary += write_texts(project, staging)
    toc = toctree_entries(project, prs)
    if toc:
        summary += ["## Doc pages to add to `_toctree.yml` by hand", "", "```", *toc, "```", ""]
    (staging / "README.md").write_text("\n".join(summary), encoding="utf-8")
    (staging / MARKER).write_text("written by `make pr`; replaced as a whole on the next run\n", encoding="utf-8")
    return toc


def rendered(project: Project, text: Path) -> str:
    """A text as it leaves the repository: its placeholders replaced by the pinned versions (texts.render), without
    the marker lines of its reproductions' output blocks (repros.MARKER), which only ``check`` reads."""
    body = render(text.read_text(encoding="utf-8"), pinned_versions(project))
    return "".join(line for line in body.splitlines(keepends=True) if not OUTPUT_MARKER.match(line.rstrip("\n")))


def write_rendered(project: Project, text: Path, dest: Path) -> None:
    dest.write_text(rendered(project, text).rstrip() + "\n", encoding="utf-8")


def write_texts(project: Project, staging: Path) -> list[str]:
    """Copy the issue drafts and the texts outside the stack; return their lines of dist/README.md."""
    lines = []
    issues = [p for p in sorted((project.root / ISSUE_DIR).glob("*.md")) if f"{ISSUE_DIR}/{p.name}" not in LEFT_OUT]
    if issues:
        (staging / ISSUES_OUT).mkdir()
        lines += ["# Issue drafts", "", f"In `{ISSUES_OUT}/`, each to rewrite in your own words before opening:", ""]
        for path in issues:
            write_rendered(project, path, staging / ISSUES_OUT / path.name)
            comment = COMMENTS.get(path.stem)
            where = f" (a comment on {comment.on}, not a new issue)" if comment else ""
            lines.append(f"- `{ISSUES_OUT}/{path.name}`{where}: {first_heading(project, path)}")
        lines.append("")
    outside = [project.root / PR_DIR / f"{name}.md" for name in OUTSIDE_STACK if f"{PR_DIR}/{name}.md" not in LEFT_OUT]
    outside = [path for path in outside if path.is_file()]
    if outside:
        (staging / OUTSIDE_OUT).mkdir()
        lines += ["# Outside the stack", "", f"In `{OUTSIDE_OUT}/` (no patch series here):", ""]
        for path in outside:
            write_rendered(project, path, staging / OUTSIDE_OUT / path.name)
            outside = OUTSIDE_STACK[path.stem]
            first = f"; **open the issue first**: `{ISSUES_OUT}/{outside.issue_first}`" if outside.issue_first else ""
            lines.append(f"- `{OUTSIDE_OUT}/{path.name}`: {outside.what}{first}")
        lines.append("")
    return lines


def first_heading(project: Project, path: Path) -> str:
    """The first line of a text, rendered, without its heading marks (what the text is)."""
    for line in rendered(project, path).splitlines():
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
