"""roundtrip / demo: thin click wrappers over recurnorm.evaluate.roundtrip."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from ..display import echo

# The README's main job: the anchors, the seed hypothesis, LayerRoPE and LoRA,
# across one gentle and two aggressive quantizers.
DEMO_SCHEMES = ("shared", "unique", "norm_gate", "layerrope", "lora")
DEMO_QUANTS = ("int8", "int4", "ternary")
# Measured at 200 steps on 2 CPU cores shared with 4-9 other busy processes: 1,224 s wall,
# 712 CPU-s (one thread); training was 81% of it (0.58 CPU-s per step), the 35 validation
# passes and 30 exports the rest (~135 CPU-s). 150 steps brings the CPU time to ~570 s,
# i.e. about 7 minutes on two cores that are not shared.
DEMO_STEPS = 150
# One torch thread by default: the tiny model gains little from a second one, and
# when anything else shares the cores OpenMP spinning made two threads 4.5x slower
# (measured: 7.0 vs 1.6 s per training step under load).
DEMO_THREADS = 1


def _split(_ctx, _param, value: str | None) -> str | None:
    return value.strip() if value else value


def _steps(_ctx, _param, value: str | None) -> list[int] | None:
    """'600' or '150,600,2400' -> [150, 600, 2400]."""
    if value is None:
        return None
    from ..errors import ConfigError
    from ..evaluate.roundtrip import resolve_steps

    try:
        return resolve_steps(value, 0)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


def _floats(_ctx, param, value: str | None) -> list[float] | None:
    """'5e-4,1e-3' -> [0.0005, 0.001]; a usage error naming the option otherwise."""
    if value is None:
        return None
    from ..errors import ConfigError
    from ..evaluate.lrsweep import parse_floats

    try:
        return parse_floats(value, param.opts[0])
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


def _match_bytes(_ctx, _param, value: str | None) -> int | str | None:
    """A positive byte count, or a scheme name (lora's rank is matched to it)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        if int(value) < 1:
            raise click.BadParameter("a byte count must be >= 1")
        return int(value)
    from ..model import schemes as registry

    if value not in registry.available():
        raise click.BadParameter(f"{value!r} is neither a byte count nor a scheme ({', '.join(registry.available())})")
    return value


# Checked with the argument: 10,000 started 20,001 threads (torch's and the workers' pools).
MAX_THREADS = 1024
THREADS = click.IntRange(min=1, max=MAX_THREADS)
MAX_JOBS = 64  # processes, each with its threads


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def _print_result(result, as_json: bool) -> None:
    if as_json:
        echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        return
    echo(result.markdown())
    for kind, path in result.paths.items():
        echo(f"{kind:>4}: {path}")


@click.command()
@click.option(
    "--schemes",
    default="shared,unique,norm,norm_gate,lora",
    show_default=True,
    callback=_split,
    help="comma-separated scheme names, or 'all'",
)
@click.option(
    "--quants",
    default="int8,int4",
    show_default=True,
    callback=_split,
    help="comma-separated quantizer formats (fp32 is the lossless reference)",
)
@click.option(
    "--data", default="default", show_default=True, help="'default', a text file, a directory of .txt, or shards:GLOB"
)
@click.option("--tokenizer", default=None, help="SentencePiece model (default: bytes)")
@click.option(
    "--seeds", type=click.IntRange(min=1), default=1, show_default=True, help="seeds per scheme; claims need >= 3"
)
@click.option("--preset", default="tiny", show_default=True, help="training preset")
@click.option(
    "--steps",
    default=None,
    callback=_steps,
    metavar="N[,N...]",
    help="training steps, or several lengths ('150,600,2400'): each trained from scratch with "
    "its own cosine schedule, seeds paired within a length, plus lengths.png (default: the preset's)",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="folder for results.{json,csv,md} and roundtrip.png",
)
@click.option(
    "--checkpoints",
    "checkpoints_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="reuse DIR/<scheme>[/seed<k>]; missing ones are trained and saved there",
)
@click.option(
    "--probe",
    "probes",
    multiple=True,
    type=click.Choice(["fragility", "shuffle"]),
    help="extra measurements (repeatable)",
)
@click.option(
    "--match-bytes",
    default=None,
    callback=_match_bytes,
    metavar="N|SCHEME",
    help="N: choose each scheme's width so its artifact lands within ±3% of N bytes; "
    "SCHEME (e.g. norm_gate): choose lora's rank so its artifact lands nearest that scheme's",
)
@click.option("--force", is_flag=True, help="overwrite existing outputs")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
@click.option("--no-progress", is_flag=True, help="no progress bars")
@click.option(
    "--qat",
    default="",
    callback=_split,
    metavar="FORMATS",
    help="also QAT-fine-tune each scheme in these formats (rows qat-<format>)",
)
@click.option(
    "--qat-steps",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="QAT fine-tuning steps per scheme and format",
)
@click.option(
    "--threads",
    type=THREADS,
    default=None,
    help=f"torch CPU threads, at most {MAX_THREADS} (default: torch's choice)",
)
@click.option(
    "--lr-sweep",
    default=None,
    callback=_floats,
    metavar="LR[,LR...]",
    help="first train every scheme at each of these peak rates, choose each scheme's best on one half "
    "of the validation split, then compare the schemes at their own rates on the other half; lr_sweep.png",
)
@click.option(
    "--control-lr-mult",
    "control_mults",
    default="1",
    show_default=True,
    callback=_floats,
    metavar="M[,M...]",
    help="with --lr-sweep: also sweep these control_lr_mult values for schemes with step-specific controls",
)
@click.option(
    "--sweep-steps",
    type=click.IntRange(min=1),
    default=None,
    help="with --lr-sweep: training steps of the sweep runs (default: the shortest of --steps)",
)
@click.option(
    "--sweep-seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="with --lr-sweep: seeds per sweep setting",
)
@click.option("--sweep-only", is_flag=True, help="with --lr-sweep: stop after the sweep (its table and plot)")
@click.option(
    "--sweep-from",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    metavar="RESULTS.json",
    help="instead of --lr-sweep: take each scheme's rate from an earlier --lr-sweep run on the same data",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1, max=MAX_JOBS),
    default=1,
    show_default=True,
    help=f"train the (scheme, seed) models in N parallel processes first, at most {MAX_JOBS} "
    "(one per GPU where there are GPUs; CPU threads split between them)",
)
def roundtrip(
    schemes,
    quants,
    data,
    tokenizer,
    seeds,
    preset,
    steps,
    out_dir,
    checkpoints_dir,
    probes,
    match_bytes,
    force,
    as_json,
    no_progress,
    qat,
    qat_steps,
    threads,
    lr_sweep,
    control_mults,
    sweep_steps,
    sweep_seeds,
    sweep_only,
    sweep_from,
    jobs,
):
    """Train each scheme, export it under each quantizer, and measure what the export costs.

    With --lr-sweep, each scheme is first tuned: trained at every rate, its best chosen on
    one half of the validation split; the comparison runs at those rates on the other half.
    """
    from ..evaluate.roundtrip import roundtrip as run

    _set_threads(threads)
    sweeping = [o for o, v in (("--sweep-steps", sweep_steps), ("--sweep-only", sweep_only)) if v]
    sweeping += ["--sweep-seeds"] * (sweep_seeds != 1) + ["--control-lr-mult"] * (control_mults != [1.0])
    if lr_sweep is None and sweeping:
        raise click.UsageError(f"{', '.join(sweeping)} only apply with --lr-sweep")
    if sweep_from is not None and lr_sweep is not None:
        raise click.UsageError("--sweep-from reuses an earlier sweep: give it or --lr-sweep, not both")
    if lr_sweep is not None or sweep_from is not None:
        if checkpoints_dir is not None:
            raise click.UsageError(
                "--checkpoints cannot be used with --lr-sweep (a checkpoint does not record its rate)"
            )
        from ..evaluate.lrsweep import lr_study

        result = lr_study(
            schemes, quants, lr_sweep, control_mults=control_mults, sweep_from=sweep_from, sweep_steps=sweep_steps,
            sweep_seeds=sweep_seeds, sweep_only=sweep_only, data=data, tokenizer=tokenizer, preset=preset,
            steps=steps, seeds=seeds, out_dir=out_dir, force=force, progress=not no_progress and not as_json,
            probes=probes, match_bytes=match_bytes, qat=qat or (), qat_steps=qat_steps, jobs=jobs,
        )  # fmt: skip
        _print_result(result, as_json)
        _fail_on_failures(result)
        return

    result = run(
        schemes,
        quants,
        data=data,
        tokenizer=tokenizer,
        seeds=seeds,
        preset=preset,
        steps=steps,
        out_dir=out_dir,
        checkpoints_dir=checkpoints_dir,
        probes=probes,
        match_bytes=match_bytes,
        force=force,
        progress=not no_progress and not as_json,
        qat=qat or (),
        qat_steps=qat_steps,
        jobs=jobs,
    )
    _print_result(result, as_json)
    _fail_on_failures(result)


def _fail_on_failures(result) -> None:
    """Exit non-zero (after the results are printed and written) when any model failed to train."""
    from ..errors import RecurnormError

    fails = result.config.get("failures") or []
    if fails:
        where = "; ".join(f"{f['scheme']}/seed{f['seed']} at {f['steps']} steps: {f['error']}" for f in fails[:3])
        more = f" (and {len(fails) - 3} more)" if len(fails) > 3 else ""
        raise RecurnormError(
            f"{len(fails)} model(s) failed to train, reported in the results and left out of the statistics: "
            f"{where}{more}"
        )


@click.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="output folder",
)
@click.option(
    "--steps", type=click.IntRange(min=1), default=DEMO_STEPS, show_default=True, help="training steps per scheme"
)
@click.option("--force", is_flag=True, help="overwrite existing outputs")
@click.option("--no-progress", is_flag=True, help="no progress bars")
@click.option(
    "--threads", type=THREADS, default=DEMO_THREADS, show_default=True, help=f"torch CPU threads, at most {MAX_THREADS}"
)
def demo(out_dir, steps, force, no_progress, threads):
    """The main job: shared, unique, norm_gate, layerrope, lora × int8, int4, ternary, one seed."""
    from ..evaluate.roundtrip import roundtrip as run

    _set_threads(threads)
    t0 = time.perf_counter()
    echo(
        f"recurnorm demo: {', '.join(DEMO_SCHEMES)} × {', '.join(DEMO_QUANTS)} on the "
        f"default corpus, tiny preset, {steps} steps, one seed",
        err=True,
    )
    result = run(
        list(DEMO_SCHEMES),
        list(DEMO_QUANTS),
        data="default",
        seeds=1,
        preset="tiny",
        steps=steps,
        out_dir=out_dir,
        force=force,
        probes=("fragility",),
        progress=not no_progress,
    )
    _print_result(result, as_json=False)
    echo(f"plot: {result.paths['png']}")
    echo(demo_closing(time.perf_counter() - t0))


# Where the demo's one-seed, 150-step answers are checked with paired seeds at three lengths.
RESULTS_DOC = "docs/RESULTS.md"


def demo_closing(elapsed_s: float) -> str:
    """The demo's last line: one seed proves nothing, and where the paired, longer study is."""
    return (
        f"done in {elapsed_s:.0f} s (one seed at {DEMO_STEPS} steps: differences are not claims; "
        f"{RESULTS_DOC} answers the four questions with 3 paired seeds at 150, 600 and 2,400 "
        "steps on two corpora: `recurnorm roundtrip --seeds 3 --steps 150,600,2400`)"
    )
