"""The workbench's configuration: the upstreams (pinned sdists, overlays, patch series, forks) and the tool pins.

``patches/config.json``::

    {"upstreams": {"transformers": {"package": ..., "version": ..., "sha256": ...,
                                    "overlay": [roots, in upstream paths], "patches": "patches/transformers",
                                    "fork": "build/transformers", "repo_dir": ".", "module": import name}, ...},
     "pins": {tool: version}, "stack": "patches/stack.json"}

Each upstream's release is held once: ``version`` and the sha256 of its sdist ``<package>-<version>.tar.gz`` (the file
name is derived; an ``sdist`` key of an older pin file is ignored). ``repo_dir`` is the repository folder mirrored onto the upstream's root (``.`` for transformers, whose new files live at
their upstream paths; ``accelerate`` for accelerate, whose ``tests/`` would clash with ours).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from .gitutil import ForkError


def read_json(path: Path, what: str, shown: str | None = None, hint: str = "") -> object:
    """
    The JSON in ``path``; a missing or malformed file is a clear error naming it as ``what`` and ``shown`` (the path
    as the user knows it, ``path`` by default), plus ``hint`` when it is missing.
    """
    shown = shown or str(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ForkError(f"{what} not found: {shown}{hint}") from None
    except json.JSONDecodeError as e:
        raise ForkError(f"{what} {shown} is not valid JSON: {e}") from None


@dataclass
class Upstream:
    """One upstream project: its pinned sdist, its overlay and patch series in the repository, its fork."""

    name: str
    package: str  # the distribution on the package index
    module: str  # the top-level import package (under src/)
    version: str
    sha256: str
    overlay_roots: list[str]
    repo_dir: Path
    patches_dir: Path
    fork_dir: Path
    cache_dir: Path
    sdist_override: Path | None = None

    @property
    def series_file(self) -> Path:
        return self.patches_dir / ".patches"

    @property
    def sdist_name(self) -> str:
        return f"{self.package}-{self.version}.tar.gz"

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}"


@dataclass
class Project:
    """Paths and settings of the workbench, all derived from the repository root and the pin file."""

    root: Path
    config_path: Path
    config: dict
    venv: Path
    upstreams: dict[str, Upstream] = field(default_factory=dict)

    @property
    def pins(self) -> dict:
        return self.config.get("pins", {})

    @property
    def stack_path(self) -> Path:
        return self.root / self.config.get("stack", "patches/stack.json")

    def rel(self, path: Path) -> str:
        """Path as shown to the user: relative to the repository root when inside it."""
        try:
            return str(Path(path).resolve().relative_to(self.root))
        except ValueError:
            return str(path)

    def select(self, names: list[str] | None) -> list[Upstream]:
        """The upstreams named (all, in configuration order, when none is)."""
        if not names:
            return list(self.upstreams.values())
        unknown = [n for n in names if n not in self.upstreams]
        if unknown:
            raise ForkError(
                f"unknown upstream {', '.join(unknown)} (known in {self.rel(self.config_path)}: "
                f"{', '.join(self.upstreams)})"
            )
        return [self.upstreams[n] for n in names]


REQUIRED = ("package", "version", "sha256")


def load_project(
    root: Path,
    config_path: Path | None = None,
    venv: Path | None = None,
    fork_dirs: dict[str, Path] | None = None,
    sdists: dict[str, Path] | None = None,
    config: dict | None = None,
) -> Project:
    """The project of the pin file ``config_path`` (or of ``config``, its content not written yet)."""
    config_path = config_path or root / "patches" / "config.json"
    if config is None:
        config = read_json(config_path, "pin file")
    project = Project(root=root, config_path=config_path, config=config, venv=venv or root / ".venv")
    entries = config.get("upstreams")
    if not isinstance(entries, dict) or not entries:
        raise ForkError(f'pin file {config_path} lacks "upstreams" (one entry per upstream sdist)')
    for name, entry in entries.items():
        for key in REQUIRED:
            if not isinstance(entry, dict) or not entry.get(key):
                raise ForkError(f"pin file {config_path} lacks upstreams.{name}.{key}")
        package = entry["package"]
        project.upstreams[name] = Upstream(
            name=name,
            package=package,
            module=entry.get("module", package),
            version=entry["version"],
            sha256=entry["sha256"].lower(),
            overlay_roots=[r.strip("/") for r in entry.get("overlay", [])],
            repo_dir=(root / entry.get("repo_dir", ".")).resolve(),
            patches_dir=root / entry.get("patches", f"patches/{name}"),
            fork_dir=(fork_dirs or {}).get(name) or root / entry.get("fork", f"build/{name}"),
            cache_dir=root / "build" / "cache",
            sdist_override=(sdists or {}).get(name),
        )
    return project
