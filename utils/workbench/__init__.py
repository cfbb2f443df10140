"""Keep our upstream forks as overlays plus patch series on pinned sdists, and cut them into a stack of PRs.

The repository holds only what we write, per upstream (``patches/config.json`` lists them: transformers, accelerate):

* the *overlay*: new files, kept at their upstream paths under the upstream's ``repo_dir`` (``src/transformers/**``,
  ``tests/trainer/**``, ``docs/source/en/**`` at the repository root; ``accelerate/src/accelerate/**`` ...), copied
  into the fork as they are;
* the *patch series*: edits to files that exist upstream, as ``git format-patch`` files under ``patches/<upstream>/``
  listed in order by ``patches/<upstream>/.patches``;
* the pins: each upstream's sdist (version and sha256) and the tool versions, in ``patches/config.json``;
* the *stack* ``patches/stack.json``: the PRs in review order, each owning overlay files and patches of one upstream,
  with its own tests and description (``docs/pr/<name>.md``).

Modules: ``project`` (configuration), ``sources`` (sdists, pristine trees), ``overlay``, ``series`` (apply, export,
lint), ``stack`` (PRs, levels, level tests), ``forks`` (build, editable install, export), ``opener`` (open, build --clone), ``clonevenv`` (clone-venv), ``upgrade``, ``pr`` (dist/ output),
``cli`` (check, deps, the command line).

Commands (``python utils/fork.py <command> --help`` for options):

``build``   per upstream: download (or reuse the cached) sdist, unpack it into ``build/<upstream>``, commit the pristine
            tree tagged ``upstream-base``, commit the overlay (tag ``workbench-overlay``), ``git am`` the series;
            then ``pip install -e`` the forks (again when a pinned version changes), and unpack the pinned releases'
            sources into ``build/stock/src``. With ``--clone PATH`` put the stack's PRs on a new branch of a
            contributor's upstream clone, authored by the contributor.
``export``  turn the forks' commits back into overlay files and patch files (byte-stable, three-way for the overlay).
``check``   lint the series, check the stack against the repository, apply the whole series PR after PR and build
            every PR's level (pristine + the PRs it depends on + the PR) with ``git am``, fail when re-exporting
            would change files; ``--tests`` also runs each PR's own tests at its level, against the other
            upstreams' releases.
``pr``      write ``dist/<NN>-<name>/`` per PR: its ``git am`` series and ``PR_DESCRIPTION.md``, authored by git's
            ``user.name``/``user.email``; print the ``_toctree.yml`` entries to add by hand.
``open``    ``make open CLONE=..``: each PR of the clone's upstream on a branch made from the clone's main, proven there:
            its tests with and without its fix, upstream's suite under the global-state guard on main and on the
            branches, the GPU check where CUDA is; one table per PR (``opener.py``).
``clone-venv`` ``make clone-venv CLONE=..``: a venv with the clone's own declared test requirements (those the package
            index has, the others named), for ``open --venv``; it checks that upstream's suite collects with it.
``deps``    install the pinned tools into the virtual environment (torch first), once per pin set.
``upgrade`` move to new upstream releases (the newest on the package index, or ``--transformers V --accelerate V``):
            download and hash the sdists, rebuild the forks on them with every PR re-applied three-way, re-export,
            write the pin file, install, run each PR's tests with and without its fix; one row per PR.

Only the standard library is used, plus the ``git`` and ``pip`` command line tools.
"""
