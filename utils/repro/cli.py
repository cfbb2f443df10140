"""The command line: the options, the worker entries (`--worker`, `--ddp-worker`), the driver start to exit status."""

import argparse
import os
import shutil
import sys
import time

from workbench.args import Parser

from .launch import PACKAGE_DIR
from .report import build_report, print_report, write_report
from .runs import run_ddp_worker
from .scenarios import SCENARIOS, VARIANTS
from .workers import DEFAULT_STOCK_SRC, ensure_stock_src, fail, run_worker, run_workers


def parse_args(argv=None):
    parser = Parser(
        description="Reproduce transformers#34053 (fp16 resume) offline against stock transformers and the fork."
    )
    parser.add_argument(
        "--out", default=os.path.join("build", "repro"), help="output directory (default: build/repro)"
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    parser.add_argument(
        "--resume-step",
        type=int,
        help="checkpoint to resume from (default: the step after the middle, 11 for 20 steps)",
    )
    parser.add_argument(
        "--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS), help="default: all"
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda if present")
    parser.add_argument("--stock-src", default=DEFAULT_STOCK_SRC, help=f"stock sources (default: {DEFAULT_STOCK_SRC})")
    parser.add_argument("--variants", default="stock,fork", help="comma-separated, default: stock,fork")
    parser.add_argument(
        "--overflow-steps",
        help="comma-separated steps (1..--steps) with forced overflow in fused_skip (default: the two middle steps, "
        "9,10 for 20 steps)",
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-worker", choices=VARIANTS, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    options.out = os.path.abspath(options.out)
    options.stock_src = os.path.abspath(options.stock_src)
    options.scenarios = list(dict.fromkeys(options.scenarios))
    options.variants = list(dict.fromkeys(v.strip() for v in options.variants.split(",") if v.strip()))
    if not options.variants or any(v not in VARIANTS for v in options.variants):
        parser.error(f"--variants: choose among {', '.join(VARIANTS)}")
    if options.steps < 2:
        parser.error(f"--steps must be at least 2 (a checkpoint to resume from, then more steps), got {options.steps}")
    if options.resume_step is None:
        options.resume_step = min(options.steps // 2 + 1, options.steps - 1)
    if not 1 <= options.resume_step < options.steps:
        parser.error("--resume-step must be at least 1 and less than --steps")
    if options.overflow_steps is None:
        options.overflow_steps = sorted({max(1, options.steps // 2 - 1), options.steps // 2})
    else:
        try:
            overflow_steps = sorted({int(s) for s in options.overflow_steps.split(",") if s.strip()})
        except ValueError:
            parser.error(f"--overflow-steps: comma-separated step numbers expected, got {options.overflow_steps!r}")
        outside = [s for s in overflow_steps if not 1 <= s <= options.steps]
        if not overflow_steps or outside:
            parser.error(
                f"--overflow-steps: steps between 1 and --steps ({options.steps}) expected, got "
                f"{options.overflow_steps!r}"
            )
        options.overflow_steps = overflow_steps
    return options


def main(argv=None) -> int:
    options = parse_args(argv)
    if options.worker or options.ddp_worker:
        try:
            if options.worker:
                run_worker(options.worker, options)
            else:
                run_ddp_worker(options.ddp_worker, options)
        except KeyboardInterrupt:  # Ctrl-C reaches the workers too: the driver says what was left, they say nothing
            return 130
        return 0
    final = options.out
    options.out = final + PARTIAL_SUFFIX
    try:
        return run_driver(options, final)
    except KeyboardInterrupt:
        shutil.rmtree(options.out, ignore_errors=True)
        kept = f"; the previous run in {final} (report.json, repro.png, run folders) is unchanged"
        print(
            f"\nrepro: interrupted: the unfinished run was removed{kept if os.path.isdir(final) else ''}. Run `make "
            "repro` again.",
            file=sys.stderr,
            flush=True,
        )
        return 130


# The new run is made beside the last one (`<out>.partial`) and replaces it only when complete, report and picture
# included: an interrupted or failed run leaves the previous one whole.
PARTIAL_SUFFIX = ".partial"
# What a run writes under `--out`: an existing `--out` holding anything else is not replaced.
OUTPUTS = {"stock", "fork", "report.json", "repro.png"}


def replace_previous(partial: str, final: str) -> None:
    """Moves the complete run `partial` to `final`, where the previous run (if any) was until then."""
    previous = final + ".previous"
    shutil.rmtree(previous, ignore_errors=True)
    if os.path.isdir(final):
        os.rename(final, previous)
    os.rename(partial, final)
    shutil.rmtree(previous, ignore_errors=True)


def _shown(path: str) -> str:
    """`path` as a command line shows it: relative to the working directory when under it."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def run_driver(options, final: str) -> int:
    start = time.perf_counter()
    if options.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: torch sees no CUDA device here (use --device cpu, or auto)")
    if "stock" in options.variants:
        ensure_stock_src(options.stock_src)
    if os.path.isdir(final + ".previous") and not os.path.isdir(final):  # stopped between the two renames
        os.rename(final + ".previous", final)
    if os.path.isdir(final) and not set(os.listdir(final)) <= OUTPUTS:
        fail(f"--out {final} holds other files than a repro run's ({', '.join(sorted(OUTPUTS))}): choose another")
    try:
        shutil.rmtree(options.out, ignore_errors=True)  # left by a run that was killed
        os.makedirs(options.out)
    except OSError as error:
        fail(f"--out {final}: cannot create the output directory ({error})")
    print(
        f"repro #34053: {options.steps} steps, resume from checkpoint-{options.resume_step}, scenarios "
        f"{', '.join(options.scenarios)}; variants {', '.join(options.variants)} (one process each) ...",
        flush=True,
    )
    workers = run_workers(options)
    report = build_report(options, workers)
    print_report(report, options)
    report_path, plot_path = write_report(report, options, final)
    replace_previous(options.out, final)
    print(f"\nreport: {report_path}\nplot:   {plot_path}")
    runs = " ".join(_shown(os.path.join(final, "fork", run)) for run in ("uninterrupted", "no_scaler_pt"))
    resume_diff = os.path.join(os.path.dirname(PACKAGE_DIR), "resume_diff.py")
    print(f"compare any two runs: {_shown(sys.executable)} {_shown(resume_diff)} {runs}")
    fork_ok = report["fork_as_expected"]
    if fork_ok is not None:
        print(f"fork behaves as fixed in every scenario: {'yes' if fork_ok else 'NO'}")
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0 if fork_ok in (True, None) else 1
