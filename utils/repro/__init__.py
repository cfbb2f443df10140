"""
Reproduce transformers#34053 offline, against stock transformers and against the fork, side by side.

Usage (what `make repro` runs):

    .venv/bin/python utils/repro [--out build/repro] [--steps 20] [--resume-step STEPS//2+1] [--scenarios ...]
                                 [--device auto|cpu|cuda] [--stock-src build/stock/src] [--variants stock,fork]

#34053: with fp16 mixed precision, the `GradScaler` loss scale was not saved in checkpoints. After a resume it
restarted at 65536, the gradients overflowed, the updates were skipped, the LR scheduler paused, and the LR and loss
curves no longer matched the uninterrupted run.

The setup follows the reporters: a run of `--steps` steps (cosine schedule, batch 4, lr 1e-5, fp16, logging and a
checkpoint at every step), then the same run resumed from `checkpoint-<resume-step>` with the later checkpoints gone
(the checkpoint is copied into a fresh output directory). Everything is offline: a tiny GPT-2 built from a config
(seeded), the prompts of `utils/data/prompts.txt` encoded by a byte-level tokenizer defined in `scenarios.py`.

Scenarios (`--scenarios`, default all):

- `exact_resume`: resume with the same settings. Must match the uninterrupted run bit for bit.
- `no_scaler_pt`: resume from a checkpoint without `scaler.pt` (as saved by transformers <= 4.48). The loss scale
  restarts at 65536 and the run cannot match; stock says nothing, the fork logs it (info).
- `bf16_resume`: resume the fp16 checkpoint with bf16. Stock crashes in `_load_scaler` (the run has no scaler); the
  fork resumes and says at info level that the saved loss scale is not used.
- `fused_skip`: two uninterrupted runs, `adamw_torch` and the default `adamw_torch_fused`, with overflows forced at
  `--overflow-steps`. A fused optimizer skips overflowing updates itself, so stock's Trainer does not see the skip and
  advances the LR schedule anyway; the fork holds it, like with `adamw_torch`.
- `ddp_exact_resume`: the run of `exact_resume` in two processes (DDP over gloo, on CPU, started with torchrun), then
  resumed from the same checkpoint. Must match bit for bit, and both processes must hold the same model.

Choices made to see the bug on a tiny model:

- Overflow at the stock loss scale: the model is initialized with `initializer_range=1.0`, which makes its fp16
  activations and gradients large, so -- like the reporters' models -- a loss scale of 65536 overflows. The
  `GradScaler` keeps its defaults (init_scale 65536, growth_interval 2000): it backs off to 8192 within the first
  steps (a few skipped updates), then stays there. With the default `initializer_range=0.02` the tiny model never
  overflows at 65536 and a lost loss scale goes unnoticed. The uninterrupted and resumed runs are otherwise
  identical, so an exact resume is bit-exact.
- Forced overflows (`fused_skip`): a hook on the input embedding's weight replaces its gradient with inf during the
  backward pass of the chosen steps. The scaler then finds inf, skips the update and halves the scale, exactly as for
  a natural overflow, at steps chosen in the middle of the schedule where the LR visibly moves.
- fp16 on CPU: accelerate builds no `GradScaler` on CPU, so `fp16=True` alone would silently train in fp32. On CPU
  each fp16 run sets `trainer.accelerator.native_amp = True` (accelerate then wraps the forward in
  `torch.autocast("cpu", torch.float16)`) and `trainer.accelerator.scaler = torch.amp.GradScaler("cpu")` before
  `train()`. With a CUDA device (`--device auto` picks it) the runs use plain `fp16=True`, no such adjustment.
- Stock Trainers do not log the loss scale, and no Trainer logs a count of skipped updates. A callback of repro
  counts the updates where the scale backed off (skipped updates) into the log entries of every fp16 run, as
  `repro_num_skipped_updates`, and records the scale in those of runs that do not log `grad_scale` themselves, as
  `repro_grad_scale`; tables and comparisons show them as `num_skipped_updates` / `grad_scale`, marked as observed.

Stock and fork run in separate worker processes of repro (in parallel), the stock one with
`PYTHONPATH=<stock src>` so that it imports the pristine sources; each worker runs all its scenarios. The stock sources must be the pinned releases
(patches/config.json) of transformers and accelerate: the default `build/stock/src` is made from the pinned sdists
(as `make fork` does) when missing or of other pins, another `--stock-src` of other versions is refused. The console
and `report.json` name the transformers and accelerate versions of stock and of the fork.

Output, under `--out` (made beside it as `<out>.partial`, which replaces the previous run only once complete, report
and picture written: an interrupted or failed run leaves the previous one whole; an `--out` holding other files is
refused): `<variant>/<scenario>/...` run directories (compare any two with `utils/resume_diff.py`),
`report.json` (settings, per scenario and variant: status, messages, step rows, first divergence with its likely
cause, verdict), `repro.png` (learning rate, loss, grad norm and loss scale against the step, reference vs
candidate; per scenario a stock row above a fork row on the same y ranges, the fork's with stock's candidate in gray;
the first divergence shaded in the panel of its field; what the LR did on skipped updates said). The console shows progress, a per-step table per scenario and variant, and the verdicts.

A run that cannot finish because its process dies (a worker, or a torchrun launch: a process that crashed or
exited with an error) does not stop the others: that scenario's verdict says `crashed: <why>` (the exit status or
signal, torchrun's root cause, the last error line), and the other scenarios' tables, `report.json` and `repro.png`
are still written. A Trainer that raises is a finding instead (`crashes: <error>`, e.g. stock with bf16).

Exit status: 0 when the fork behaves as fixed in every scenario run (exact resume identical, an info line without
`scaler.pt`, no crash with bf16, LR held on skipped updates), 1 otherwise (a fork scenario that crashed included), 2 on
a usage or setup error, said in one line before anything runs (e.g. `--device cuda` where torch sees no CUDA device),
130 on Ctrl-C (one line: the unfinished run removed, the previous one unchanged; no worker prints a traceback). `make`
turns every failure into its own status 2: scripts that need these run `.venv/bin/python utils/repro` (what `make
repro` runs, after `make fork`).

The code, in the order the data flows (each module imports only those before it): `scenarios.py` (what is run),
`runs.py` (training a run in this process), `launch.py` (starting processes, torchrun's output), `workers.py` (the
worker processes), `verdicts.py` (comparisons and verdicts), `report.py` (tables, report.json, the plot), `cli.py`
(the command line).
"""
