"""Checks of the upstream-bound texts: the PR descriptions (``docs/pr/*.md``) and the issue drafts
(``docs/issues/*.md``) a contributor opens upstream in their own name.

Each text must be short enough to read, check and rewrite, in its upstream's current PR template, and cite only
issues and PRs that were looked up (``docs/references.json``)::

    {"references": [{"repo": "huggingface/transformers", "number": 34053, "kind": "issue", "title": "...",
                     "state": "closed", "looked_up": "2026-12-01"}, ...]}

A bare ``#N`` in a text means its own upstream's repository; ``owner/repo#N`` and GitHub issue/PR links name theirs.

Every factual sentence of a text has its evidence beside it, in ``<stem>.claims.json`` next to ``<stem>.md``::

    {"claims": [{"claim": "<an exact substring of the text, whitespace runs compared as one space>",
                 "evidence": "ran: <command, where, at which version> -> <what it printed>"}, ...]}

(or ``"read: <owner/repo>@<version or commit> <path>:<line(s)> <what it says>"``; ``repros.py`` re-checks a ``read:``
that quotes one of our upstreams at the pinned version).

A text and its claims name the pinned releases through one source, ``patches/config.json``: ``{{transformers}}`` and
``{{accelerate}}`` (any upstream's name, and any tool of ``pins``, e.g. ``{{torch}}``) render to the pinned version,
everywhere (code blocks included), before every check and wherever a text leaves the repository (``make pr``). So an
upgrade of the pin re-words every text, and ``make check`` re-runs their reproductions and re-reads their quotes on
the new release. A release written out (a three-part transformers 4.x/5.x or accelerate 1.x version with a two-digit
minor, e.g. ``5.24.0``, as ``RELEASE`` recognises it) is a problem: it would go stale silently. A release named on
purpose, because something was measured on it and is not re-run, is written ``{{5.24.0}}`` (it renders as written);
historical mentions of a release line (``4.49``) have two parts and are not releases here.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .gitutil import ForkError
from .project import Project
from .stack import load_stack


REFERENCES = "docs/references.json"
PR_DIR = "docs/pr"
ISSUE_DIR = "docs/issues"
PR_WORDS = 150
ISSUE_WORDS = 300
NOTE_WORDS = 300
COMMENT_WORDS = 250
CLAIMS_SUFFIX = ".claims.json"
EVIDENCE_KINDS = ("ran: ", "read: ")
REPOS = {"transformers": "huggingface/transformers", "accelerate": "huggingface/accelerate"}
POLICY_URL = "https://github.com/huggingface/transformers/blob/main/CONTRIBUTING.md"
# The line, on its own, of every description whose change has a CUDA-only path (``cuda_only`` in patches/stack.json),
# until `make open`'s GPU check replaces it in dist/ with its result. Not prose: the word limit does not count it.
NOT_RUN_ON_GPU = "The CUDA-only path of this change has not been run on a GPU."
# ... or, once it ran, a line of its own that starts with these words and says where and what came out (its evidence in
# the claims file, like any other claim); not counted as prose either.
RAN_ON_GPU = "Run on a GPU"


def gpu_line(line: str) -> bool:
    """Whether a line (stripped) says that the CUDA-only path has not run on a GPU, or what it did there."""
    return line == NOT_RUN_ON_GPU or line.startswith(RAN_ON_GPU)


# An absolute path of the machine a claim was checked on (evidence names paths relative to the repository or as
# <placeholders>).
MACHINE_PATH = re.compile(r"(?<![\w.:/~-])(?:~|/(?:tmp|home|work|root|Users|mnt|var|opt|srv|private|scratch))/")
# The section headings of each upstream's current .github/PULL_REQUEST_TEMPLATE.md, in order.
TEMPLATES = {
    "transformers": ["# What does this PR do?", "## Code Agent Policy", "## Before submitting", "## Who can review?"],
    "accelerate": ["# What does this PR do?", "## Before submitting", "## Who can review?"],
}


class Outside(NamedTuple):
    """A text of ``docs/pr`` outside the stack: its upstream (None for a note that follows no template, a review
    comment), what it is (for dist/README.md) and the issue draft to open before it (None: none)."""

    upstream: str | None
    what: str
    issue_first: str | None = None


OUTSIDE_STACK = {
    "tests-gc-freeze-after-collection": Outside(
        "transformers",
        "a PR description for a four-line hook in upstream's root `conftest.py` (not in the sdist, so no series: "
        "make the change by hand in your clone)",
        "transformers-gc-freeze-after-collection.md",
    ),
}


# Texts kept in ``docs/pr`` or ``docs/issues`` (checked like the others) but not in dist/, by path: why each stays out.
LEFT_OUT = {
    f"{ISSUE_DIR}/transformers-fused-optimizer-skip.md": "it reports in transformers what accelerate#4242 already "
    "reports; its Trainer-level reproduction is for that thread, if a maintainer asks how the Trainer is affected",
}


class Comment(NamedTuple):
    """A draft in ``docs/issues`` that is a comment on an existing issue, not a new issue: where to post it, what it
    is (for dist/README.md) and the PR of the stack that waits for it (posted first, answered by a maintainer)."""

    on: str  # owner/repo#N
    what: str
    before: str
    # What the PR waits for, when more than an answer: e.g. a maintainer preferring a PR of ours to an open one.
    answer: str = ""


COMMENTS = {
    "accelerate-4243-review": Comment(
        "huggingface/accelerate#4243",
        "proposes the `found_inf` read on the open PR that fixes the same bug, before any PR of ours",
        "accelerate-fused-skip",
        "a maintainer on huggingface/accelerate#4243 preferring a separate PR (otherwise this PR is not opened)",
    ),
    "accelerate-4242-comment": Comment(
        "huggingface/accelerate#4242",
        "proposes reading the `found_inf` the scaler hands AMP-aware optimizers, on the issue that reports the bug",
        "accelerate-fused-skip",
    ),
}
# Words about how the texts were made, which a maintainer must not read (case-insensitive, whole words: "restored"
# is fine, and so is the template's own "make sure").
FORBIDDEN = (
    "bench/",
    "utils/",
    "make ",
    "patches/",
    "workbench",
    "stored",
    "session",
    "earlier revision",
    "our tooling",
)


def _forbidden(word: str) -> re.Pattern:
    tail = r"(?!sure\b)" if word == "make " else (r"(?!\w)" if word[-1].isalnum() else "")
    # A folder word starts a path: upstream's own `tests/utils/` or `src/transformers/utils/` are not ours
    head = r"(?<![\w/])" if word.endswith("/") else r"(?<!\w)"
    return re.compile(head + re.escape(word) + tail, re.IGNORECASE)


FORBIDDEN_RE = [(word, _forbidden(word)) for word in FORBIDDEN]
# Upstream's policy is linked, never copied: phrases of its text.
POLICY_PHRASES = ("overwhelmed by a large number", "OpenClaw", "deliberately intended")
MAX_HANDLES = 2
REPRO_LINES = 30  # a reproduction (a ```python block) a reader can run and read
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.DOTALL | re.MULTILINE)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
CHECKBOX = re.compile(r"^\s*[-*] \[[ xX]\]")
WORD = re.compile(r"[^\W_]+(?:['’.\-/][^\W_]+)*")
CITE = re.compile(
    r"(?:https://github\.com/(?P<lrepo>[\w.-]+/[\w.-]+)/(?:issues|pull)/(?P<lnum>\d+))"
    r"|(?:(?<![\w/])(?P<repo>[\w.-]+/[\w.-]+)?#(?P<num>\d+)\b)"
)
# The pinned versions: {{transformers}}, {{torch}}; a release named on purpose: {{5.24.0}}.
PLACEHOLDER = re.compile(r"\{\{([\w.-]+)\}\}")
# A release of transformers (4.x, 5.x) or accelerate (1.x), as shared/hooks/before-stop recognises it (also before a
# full stop).
RELEASE = re.compile(r"(?<![\d.])(?:[45]\.\d{2}|1\.\d{2})\.\d+(?!\.?\d)")
LITERAL_RELEASE = re.compile(r"\d+\.\d+\.\d+")
HANDLE = re.compile(r"(?<![\w/])@([A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)")


@dataclass
class Text:
    path: Path
    kind: str  # "pr", "issue", "comment" or "note"
    upstream: str | None  # the repository a bare #N means (transformers, accelerate); None when unknown

    @property
    def limit(self) -> int:
        return {"pr": PR_WORDS, "issue": ISSUE_WORDS, "comment": COMMENT_WORDS, "note": NOTE_WORDS}[self.kind]


def pinned_versions(project: Project) -> dict[str, str]:
    """What each placeholder renders to: every upstream's pinned version, then every tool pin."""
    return {name: u.version for name, u in project.upstreams.items()} | {k: str(v) for k, v in project.pins.items()}


def render(text: str, versions: dict[str, str]) -> str:
    """``text`` with ``{{name}}`` replaced by its pinned version and ``{{5.24.0}}`` by ``5.24.0`` (unknown names are
    left as they are: ``release_problems`` reports them)."""

    def value(m: re.Match) -> str:
        name = m.group(1)
        return versions.get(name, name if LITERAL_RELEASE.fullmatch(name) else m.group(0))

    return PLACEHOLDER.sub(value, text)


def release_problems(where: str, text: str, versions: dict[str, str]) -> list[str]:
    """Placeholders that name nothing pinned, and releases written out rather than through a placeholder."""
    problems = [
        f"{where}: {{{{{name}}}}} names no pin (known: {', '.join(versions)}; or {{{{X.Y.Z}}}} for a release on "
        "purpose)"
        for name in dict.fromkeys(PLACEHOLDER.findall(text))
        if name not in versions and not LITERAL_RELEASE.fullmatch(name)
    ]
    for release in dict.fromkeys(RELEASE.findall(PLACEHOLDER.sub("", text))):
        names = [n for n in versions if versions[n] == release] or [n for n in versions if RELEASE.match(versions[n])]
        pinned = " or ".join(f"{{{{{n}}}}}" for n in names) or "a placeholder"
        problems.append(
            f"{where}: names the release {release} literally: write {pinned} for the pinned one, or "
            f"{{{{{release}}}}} for this release on purpose (something measured on it and not re-run)"
        )
    return problems


def prose(text: str) -> str:
    """The text a reader reads as prose: without code blocks, HTML comments, headings and checklist items."""
    text = COMMENT.sub("", FENCE.sub("", text))
    lines, in_item = [], False
    for line in text.splitlines():
        if CHECKBOX.match(line):
            in_item = True
            continue
        if in_item and line.startswith((" ", "\t")) and line.strip():
            continue  # the continuation of a checklist item
        in_item = False
        if line.lstrip().startswith("#") and re.match(r"\s*#+ ", line):
            continue
        lines.append(line)
    return "\n".join(lines)


def word_count(text: str) -> int:
    """Prose words (see ``prose``; the GPU line, ``gpu_line``, is not prose); a link counts as its text."""
    body = "\n".join(line for line in prose(text).splitlines() if not gpu_line(line.strip()))
    body = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", body)
    return len(WORD.findall(body))


def headings(text: str) -> list[str]:
    return [line.strip() for line in COMMENT.sub("", FENCE.sub("", text)).splitlines() if re.match(r"#+ ", line)]


def section(text: str, heading: str) -> str:
    """The body of ``heading`` up to the next heading of the same or a higher level ('' when absent)."""
    lines = COMMENT.sub("", FENCE.sub("", text)).splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    out, inside = [], False
    for line in lines:
        m = re.match(r"(#+) ", line)
        if inside and m and len(m.group(1)) <= level:
            break
        if inside:
            out.append(line)
        if line.strip() == heading:
            inside = True
    return "\n".join(out)


def citations(text: str, upstream: str | None) -> set[tuple[str, int]]:
    """(repository, number) for every ``#N``, ``owner/repo#N`` and GitHub issue/PR link (code blocks included)."""
    found = set()
    for m in CITE.finditer(text):
        if m.group("lnum"):
            found.add((m.group("lrepo"), int(m.group("lnum"))))
        else:
            repo = m.group("repo") or REPOS.get(upstream or "", "")
            found.add((repo, int(m.group("num"))))
    return found


def load_references(project: Project) -> tuple[dict[tuple[str, int], dict], list[str]]:
    path = project.root / REFERENCES
    if not path.is_file():
        return {}, []  # nothing looked up: any citation is a problem
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        return {}, [f"{REFERENCES} is not valid JSON: {e}"]
    refs, problems = {}, []
    entries = data.get("references") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return {}, [f'{REFERENCES} must hold {{"references": [...]}}']
    for i, entry in enumerate(entries, 1):
        missing = [
            key
            for key in ("repo", "number", "kind", "title", "state", "looked_up")
            if not isinstance(entry, dict) or entry.get(key) in (None, "")
        ]
        if missing:
            problems.append(f"{REFERENCES}, entry {i}: missing {', '.join(missing)}")
            continue
        if entry["kind"] not in ("issue", "pr"):
            problems.append(f"{REFERENCES}, entry {i}: kind must be issue or pr, not {entry['kind']!r}")
        if entry["state"] not in ("open", "closed", "merged"):
            problems.append(f"{REFERENCES}, entry {i}: state must be open, closed or merged, not {entry['state']!r}")
        refs[(entry["repo"], int(entry["number"]))] = entry
    return refs, problems


def upstream_texts(project: Project) -> list[Text]:
    """The PR descriptions (of the stack and outside it), then the issue drafts."""
    texts, seen = [], set()
    try:
        prs = load_stack(project)
    except ForkError:
        prs = []  # `make check` reports the stack itself
    for pr in prs:
        if pr.description and (project.root / pr.description).is_file():
            texts.append(Text(project.root / pr.description, "pr", pr.upstream))
            seen.add((project.root / pr.description).resolve())
    for path in sorted((project.root / PR_DIR).glob("*.md")):
        if path.resolve() in seen:
            continue
        outside = OUTSIDE_STACK.get(path.stem)
        upstream = outside.upstream if outside else _named_upstream(path.stem) or "transformers"
        texts.append(Text(path, "pr" if upstream else "note", upstream or _named_upstream(path.stem)))
    for path in sorted((project.root / ISSUE_DIR).glob("*.md")):
        texts.append(Text(path, "comment" if path.stem in COMMENTS else "issue", _named_upstream(path.stem)))
    return texts


def claims_path(text: Path) -> Path:
    """The evidence file beside a text: ``docs/pr/x.md`` -> ``docs/pr/x.claims.json``."""
    return text.with_name(text.stem + CLAIMS_SUFFIX)


def _spaced(text: str) -> str:
    return " ".join(text.split())


def claims_problems(project: Project, path: Path, body: str) -> list[str]:
    """What is wrong with the claims file of the text at ``path`` (``body``: the text, rendered): missing, malformed,
    empty, a claim the text does not make, evidence that says neither what was run nor what was read, a release
    written out."""
    rel, where = project.rel(path), project.rel(claims_path(path))
    if not claims_path(path).is_file():
        return [f"{rel}: no {where} (each factual sentence with what was run or read to show it)"]
    try:
        data = json.loads(claims_path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        return [f"{where} is not valid JSON: {e}"]
    entries = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        return [f'{where} must hold {{"claims": [...]}} with at least one claim']
    problems, text, versions = [], _spaced(body), pinned_versions(project)
    for i, entry in enumerate(entries, 1):
        claim = entry.get("claim") if isinstance(entry, dict) else None
        evidence = entry.get("evidence") if isinstance(entry, dict) else None
        fields = "\n".join(field for field in (claim, evidence) if isinstance(field, str))
        problems += release_problems(f"{where}, claim {i}", fields, versions)
        if not isinstance(claim, str) or not claim.strip():
            problems.append(f"{where}, claim {i}: no claim")
        elif _spaced(render(claim, versions)) not in text:
            problems.append(f"{where}, claim {i}: {rel} does not say {_spaced(render(claim, versions))[:60]!r}")
        if not isinstance(evidence, str) or not any(
            evidence.startswith(kind) and evidence[len(kind) :].strip() for kind in EVIDENCE_KINDS
        ):
            problems.append(f"{where}, claim {i}: evidence must say 'ran: <command> -> <output>' or 'read: <source>'")
            continue
        if evidence.startswith("ran: ") and not any(
            name in project.upstreams or LITERAL_RELEASE.fullmatch(name) for name in PLACEHOLDER.findall(evidence)
        ):
            problems.append(
                f"{where}, claim {i}: a 'ran:' names the release it ran on ({{{{transformers}}}}, {{{{accelerate}}}}, "
                "or {{X.Y.Z}} for a release on purpose)"
            )
        path = MACHINE_PATH.search(evidence)
        if path:
            problems.append(
                f"{where}, claim {i}: evidence holds a path of this machine ({evidence[path.start() :][:40]!r}): name "
                "it relative to the repository or as <what it is>"
            )
    return problems


def orphan_claims(project: Project) -> list[str]:
    """Claims files whose text is gone."""
    return [
        f"{project.rel(path)}: its text {path.name[: -len(CLAIMS_SUFFIX)]}.md does not exist"
        for folder in (PR_DIR, ISSUE_DIR)
        for path in sorted((project.root / folder).glob("*" + CLAIMS_SUFFIX))
        if not path.with_name(path.name[: -len(CLAIMS_SUFFIX)] + ".md").is_file()
    ]


def missing_comments(project: Project) -> list[str]:
    """A registered comment whose PR is in the stack must exist: that PR waits for it."""
    try:
        names = {pr.name for pr in load_stack(project)}
    except ForkError:
        return []
    return [
        f"{ISSUE_DIR}/{stem}.md does not exist: PR {comment.before} waits for this comment on {comment.on}"
        for stem, comment in COMMENTS.items()
        if comment.before in names and not (project.root / ISSUE_DIR / f"{stem}.md").is_file()
    ]


def _named_upstream(stem: str) -> str | None:
    return next((name for name in REPOS if stem.startswith(name)), None)


def text_problems(project: Project) -> list[str]:
    """Everything wrong with the upstream-bound texts, one line each (nothing when they are fine)."""
    refs, problems = load_references(project)
    versions = pinned_versions(project)
    try:
        prs = load_stack(project)
    except ForkError:
        prs = []  # `make check` reports the stack itself
    cuda_only = {(project.root / pr.description).resolve(): pr.cuda_only for pr in prs if pr.cuda_only}
    for text in upstream_texts(project):
        rel = project.rel(text.path)
        raw = text.path.read_text(encoding="utf-8")
        problems += release_problems(rel, raw, versions)
        body = render(raw, versions)
        words = word_count(body)
        if words > text.limit:
            problems.append(f"{rel}: {words} words of prose, more than {text.limit} (code blocks not counted)")
        for word, pattern in FORBIDDEN_RE:
            if pattern.search(body):
                problems.append(f"{rel}: says {word.strip()!r}, which is about how it was made, not about the change")
        blocks = PYTHON_BLOCK.findall(body)
        for block in blocks:
            if len(block.splitlines()) > REPRO_LINES:
                problems.append(f"{rel}: a reproduction of {len(block.splitlines())} lines, more than {REPRO_LINES}")
        if text.kind == "pr" and len(blocks) > 1:
            problems.append(f"{rel}: {len(blocks)} reproductions (```python blocks), more than one")
        if "#<" in body:
            problems.append(f"{rel}: holds a '#<' placeholder")
        if text.kind == "issue" and text.upstream is None:
            problems.append(f"{rel}: name it after its repository ({' or '.join(f'{n}-...' for n in REPOS)})")
        for repo, number in sorted(citations(body, text.upstream)):
            if not repo:
                problems.append(f"{rel}: cites #{number} but its repository is unknown (write owner/repo#{number})")
            elif (repo, number) not in refs:
                problems.append(f"{rel}: cites {repo}#{number}, which is not in {REFERENCES} (look it up first)")
        if text.kind == "pr":
            problems += template_problems(rel, body, text.upstream)
        if text.path.resolve() in cuda_only and not any(gpu_line(line.strip()) for line in body.splitlines()):
            problems.append(
                f"{rel}: its change has a CUDA-only path ({cuda_only[text.path.resolve()]}): say so on a line of its "
                f"own, {NOT_RUN_ON_GPU!r} (`make open`'s GPU check replaces it with its result), or what it did on "
                f"a GPU, on a line starting {RAN_ON_GPU!r}"
            )
        problems += claims_problems(project, text.path, body)
    return problems + orphan_claims(project) + missing_comments(project)


def template_problems(rel: str, body: str, upstream: str | None) -> list[str]:
    template = TEMPLATES.get(upstream or "")
    if template is None:
        return []
    problems = []
    found = [h for h in headings(body) if h in template]
    if found != template:
        problems.append(f"{rel}: the sections must be {template} in this order (found {found})")
    if "## Code Agent Policy" in template:
        policy = section(body, "## Code Agent Policy")
        if re.search(r"^\s*[-*] \[[xX]\]", policy, re.MULTILINE) or not re.search(
            r"^\s*[-*] \[ \]", policy, re.MULTILINE
        ):
            problems.append(f"{rel}: the Code Agent Policy checkbox is the submitter's: leave it there, unticked")
        if POLICY_URL not in policy:
            problems.append(f"{rel}: the Code Agent Policy section links the policy ({POLICY_URL})")
        for phrase in POLICY_PHRASES:
            if phrase.lower() in body.lower():
                problems.append(f"{rel}: copies upstream's policy text ({phrase!r}); link it instead")
    handles = set(HANDLE.findall(section(body, "## Who can review?")))
    if len(handles) > MAX_HANDLES:
        problems.append(f"{rel}: tags {len(handles)} reviewers ({', '.join(sorted(handles))}), at most {MAX_HANDLES}")
    return problems


def word_counts(project: Project) -> list[tuple[str, int, int]]:
    """(path, prose words, limit) of every upstream-bound text, for the closing note of `make pr`."""
    versions = pinned_versions(project)
    return [
        (project.rel(t.path), word_count(render(t.path.read_text(encoding="utf-8"), versions)), t.limit)
        for t in upstream_texts(project)
    ]
