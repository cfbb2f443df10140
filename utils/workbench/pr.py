"""PR output: one folder per PR of the stack under ``dist/`` (its ``git am`` series and PR_DESCRIPTION.md), authored
by the contributor, written to a staging folder and swapped in whole (never half-written)."""

import os
import shutil
import tempfile
from pathlib import Path

from .gitutil import ForkError, contributor_env, git
from .project import Project
from .stack import DEPS_TAG, PR, build_levels, changed_files, dependencies, doc_pages, level_ref, prs_of


MARKER = ".workbench-pr"


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
                    f"- upstream: {upstream.label}" + (f", on top of {', '.join(below)}" if below else " (pristine)"),
                    f"- depends on: {', '.join(pr.depends_on) or 'nothing'}",
                    f"- new files: {', '.join(added) or 'none'}",
                    f"- changed files: {', '.join(modified) or 'none'}",
                    f"- tests: {', '.join(pr.tests)}",
                    "",
                ]
    toc = toctree_entries(project, prs)
    if toc:
        summary += ["## Doc pages to add to `_toctree.yml` by hand", "", "```", *toc, "```", ""]
    (staging / "README.md").write_text("\n".join(summary), encoding="utf-8")
    (staging / MARKER).write_text("written by `make pr`; replaced as a whole on the next run\n", encoding="utf-8")
    return toc


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
