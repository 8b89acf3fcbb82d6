"""pack / unpack / verify / inspect: thin click wrappers over recurnorm.budget."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import click

from ..budget.cap import DEFAULT_MAX_BYTES
from ..budget.spec import MAGIC
from ..display import echo
from ..errors import ArtifactError, CheckpointError, OverCapError
from .exitcodes import OVER_CAP

MAX_BYTES_HELP = "byte cap (decimal), counting the artifact plus --code files and --loader"
CAP = click.IntRange(min=1)  # a cap of 0 or less is a mistake, not a request
MAX_BYTES_OPTION = click.option(
    "--max-bytes", type=CAP, default=DEFAULT_MAX_BYTES, show_default=True, help=MAX_BYTES_HELP
)
CODE_HELP = "code file (or folder of .py files) counted against the cap; regular files only"
LOADER_HELP = "the artifact's loader (recurnorm loader -o FILE): counted against the cap like code"
# What pack, inspect and plan print when no code is counted: the challenge counts it.
CODE_NOTE = (
    "note: the cap counts code too: pass --code train_gpt.py (and --loader rnpk_load.py "
    "when the artifact loads through recurnorm's loader) to count it"
)
DECODED_OPTION = click.option(
    "--max-decoded-bytes",
    type=CAP,
    default=None,
    help="refuse artifacts whose tensors decode to more bytes than this [default: 64 x the "
    "artifact's bytes, at least 1 GiB, at most the machine's memory]; checked before decoding, "
    "so a small hostile file cannot take the machine's memory",
)


def jobs_option(what: str):
    """--jobs N of pack, verify and unpack: at most the cores available (the default)."""
    return click.option(
        "--jobs",
        type=click.IntRange(min=1),
        default=None,
        help=f"{what} at once, in worker processes (the same result for any number; at most the "
        "cores available, its default: more would only hold more memory)",
    )


def default_jobs(jobs: int | None) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(jobs or cores, cores)


def _inputs(*paths) -> list[Path]:
    """Files a command reads, which its outputs must never replace."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        out.append(p)
        if p.is_dir():  # (imported here: verify of artifacts needs no torch, which export/ imports)
            from ..export.load import SHARD_INDEXES, checkpoint_files

            with contextlib.suppress(CheckpointError):  # (a folder without one: the command says so)
                out += checkpoint_files(p)
            out += [p / name for name in ("config.json", *SHARD_INDEXES)]
    return out


def _default_out(ckpt: Path) -> Path:
    """CKPT's stem + .rnpk beside it; `pack .` or `pack ..` names the folder itself."""
    base = ckpt.resolve() if ckpt.name in ("", ".", "..") else ckpt
    if not base.name:
        raise click.UsageError(f"{ckpt} has no name to make the artifact's from: give -o OUT")
    return base.with_name((base.stem if base.is_file() else base.name) + ".rnpk")


def _echo_json(obj: object) -> None:
    echo(json.dumps(obj, indent=2, sort_keys=True))


def _is_artifact(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


QUANT_HELP = (
    "format with options (int6, int4:group=128, int6:clip=sigma:12) or rules, first match wins "
    "('tok_emb.weight=int8,blocks.*.mlp.*=int5,*=int6'); a wildcard rule reaches weights "
    "and embeddings, a control tensor only by its exact name; a rule that changes no tensor "
    "is refused; export options beside any intN: lqer=RANK (lqer_l/lqer_r=FORMAT: a low-rank "
    "correction), rdo=λ (rate-aware rounding); @pg-record: the best Parameter Golf record's export. "
    "Formats and options: below"
)
POLICY_EPILOG = """\b
-q FORMAT[:OPTION=VALUE...] or PATTERN=FORMAT[:...],... (values: true/false, none, numbers, text).
Formats and their options [default (where a format differs)]:
{formats}

\b
--policy FILE.toml (every key optional; -q's main format wins, its rules come first):
  format = "int6"                  # main format
  options = {{ clip = "sigma:12" }}  # its options
  embedding = "int8"               # embeddings (tok_emb, lm_head, embed_tokens, wte, ...)
  keep_float = ["*.bias"]          # fp32, like --keep-float
  quantize_controls = false        # true quantizes gains and gates too
  rules = ["blocks.*.mlp.*=int5", "tok_emb.weight=int8:clip=sigma:20"]
See docs/POLICY.md for the order in which rules apply."""


class PolicyCommand(click.Command):
    """A command whose --help ends with every format and option, read from the quantizers' registry
    when help is asked for (importing it at startup would cost `recurnorm --help` torch's import)."""

    def format_epilog(self, ctx, formatter):
        from ..quant.registry import formats_help

        self.epilog = POLICY_EPILOG.format(formats="\n".join("  " + ln for ln in formats_help().splitlines()))
        super().format_epilog(ctx, formatter)


def policy_options(f):
    """-q, --policy, --keep-float, --quantize-controls, --keep-float-max-numel (pack and inspect)."""
    for opt in reversed(
        [
            click.option("-q", "--quant", "quant", default=None, help=QUANT_HELP + " [default: int8]"),
            click.option(
                "--policy",
                "policy_file",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="TOML policy file (format, options, embedding, keep_float, quantize_controls, rules; "
                "see below); -q's rules come first",
            ),
            click.option(
                "--keep-float",
                "keep_float",
                multiple=True,
                metavar="PATTERN",
                help="tensors matching PATTERN stay fp32, controls and vectors too (repeatable; "
                "a pattern that matches no tensor is refused)",
            ),
            click.option("--quantize-controls", is_flag=True, help="quantize gains/gates too (fragility probe)"),
            click.option(
                "--keep-float-max-numel",
                type=int,
                default=None,
                help="float vectors this small stay fp16 (weight matrices are always quantized)",
            ),
        ]
    ):
        f = opt(f)
    return f


def budget_options(f):
    """--code and --loader: the same meaning on pack, verify, inspect and plan."""
    f = click.option("--loader", "loader", type=click.Path(exists=True, dir_okay=False), help=LOADER_HELP)(f)
    return click.option("--code", "code_files", multiple=True, type=click.Path(exists=True), help=CODE_HELP)(f)


def say_notes(notes, budget=None) -> None:
    """Notes on stderr (wrapper prefixes stripped, ...), and that code counts when none is counted."""
    for note in notes:
        echo(f"note: {note}", err=True)
    if budget is not None and not budget.counts_code():
        echo(CODE_NOTE, err=True)


def policy_from_options(quant, policy_file, keep_float, quantize_controls, keep_float_max_numel):
    from ..export.spec import build_policy

    if quant is None and policy_file is None:
        quant = "int8"
    return build_policy(
        quant,
        policy_file=policy_file,
        keep_float=keep_float,
        quantize_controls=quantize_controls,
        keep_float_max_numel=keep_float_max_numel,
    )


@click.command(cls=PolicyCommand)
@click.argument("ckpt", type=click.Path(exists=True, path_type=Path))
@policy_options
@click.option("-o", "--out", type=click.Path(path_type=Path), help="artifact path (default: CKPT stem + .rnpk)")
@click.option(
    "--max-bytes",
    type=CAP,
    default=None,
    help=MAX_BYTES_HELP + f" [default: --fit's BYTES, else {DEFAULT_MAX_BYTES}]",
)
@budget_options
@click.option("--force", is_flag=True, help="overwrite OUT (never the checkpoint itself)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option(
    "--effort",
    type=click.Choice(["normal", "max"]),
    default="normal",
    show_default=True,
    help="codec search: max tries every context size and zstd layout at its slow level, and "
    "predicts the int8 rows of every tensor from similar earlier rows (normal: tensors of "
    "4096 rows or more, such as a token embedding), for the last bytes (several times slower)",
)
@click.option(
    "--fit",
    "fit_bytes",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="choose a format per weight matrix (int8..int4; embeddings, controls and your rules "
    "stay) minimizing the predicted loss increase with artifact + --code files + --loader "
    "<= BYTES, which is also the cap unless --max-bytes is given; without --calib-data the "
    "sensitivities are a weight-space proxy (it says so)",
)
@click.option(
    "--fit-formats",
    default=None,
    metavar="LIST",
    help="candidate formats for --fit, comma separated [default: int8,int7,int6:clip=record,int6,int5:clip=record,int5,int4; "
    "clip=record: the clip the 2026-04-27 record gives the tensor's role, std:13 attention, std:11.5 MLP, "
    "std:12.85 other]; all: bits x std:K clips x LQER x rate-aware rounding; quick: fewer of those; "
    "add ternary only for a model trained for it",
)
@click.option(
    "--gptq",
    is_flag=True,
    help="GPTQ codes for the weight matrices (needs --calib-data or --hessians): Hessians of the inputs "
    "of every nn.Linear, F.linear or matmul that uses a weight or a slice of one (a tied embedding as "
    "the head too); the matrices it cannot reach are named, and none is an error",
)
@click.option(
    "--hessians",
    "hessians_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="with --gptq: a safetensors file of {weight name: H = sum x x^T [in, in]} (your own "
    "calibration; a bank's slices by the names its unbanking gives) instead of --calib-data",
)
@click.option(
    "--calib-data",
    default=None,
    metavar="DATA",
    help="calibration data for --gptq and --fit (default, a text path or shards:GLOB); only its training split is read",
)
@click.option("--tokenizer", default=None, help="SentencePiece model of --calib-data text")
@click.option(
    "--calib-tokens", type=click.IntRange(min=1), default=None, help="training tokens for calibration [default: 32768]"
)
@click.option(
    "--fit-sensitivity",
    type=click.Choice(["direct", "fisher", "hessian"]),
    default="direct",
    show_default=True,
    help="direct: calibration Δloss with each tensor alone quantized (formats x tensors passes); "
    "fisher: ½ΣFδ² from one backward per window (cheaper on large models); "
    "hessian: tr(δHδᵀ) of each layer's calibration inputs, scaled by one Δloss pass per tensor "
    "(many candidates, e.g. --fit-formats all)",
)
@click.option(
    "--fit-embeddings",
    is_flag=True,
    help="--fit chooses the embeddings' formats too, by the same measured loss "
    "(by default they keep the policy's int8: the input and, tied, the output)",
)
@click.option(
    "--model-factory",
    default=None,
    metavar="MODULE:FUNCTION",
    help="build a foreign checkpoint's model with FUNCTION(config or None) -> nn.Module "
    "(for --gptq and --fit): forward(x) -> logits or forward(x, y) -> mean loss, its context "
    "length in model.seq_len (or block_size, max_seq_len, train_seq_len); imports and runs that code",
)
@DECODED_OPTION
@jobs_option("tensors coded (and decoded by its self-check)")
def pack(
    ckpt,
    quant,
    policy_file,
    keep_float,
    quantize_controls,
    keep_float_max_numel,
    out,
    max_bytes,
    code_files,
    loader,
    force,
    as_json,
    effort,
    fit_bytes,
    fit_formats,
    gptq,
    hessians_file,
    calib_data,
    tokenizer,
    calib_tokens,
    fit_sensitivity,
    fit_embeddings,
    model_factory,
    max_decoded_bytes,
    jobs,
):
    """Quantize and entropy-pack any checkpoint into one .rnpk artifact.

    The export policy is printed with every result, as format counts of what it chose:
    every weight matrix gets the -q format, embeddings int8, control tensors (gains,
    gates, scales; LayerNorm, layer_norm, ln_f) fp32, small vectors fp16 (a float -q
    format keeps them in it); `inspect` shows the rule that chose each tensor's format.
    A wrapper prefix on every name (`_orig_mod.`, `module.`) is stripped, and said.
    A .safetensors checkpoint, or a folder of one or of its shards (a Hugging Face
    model.safetensors.index.json), is read, coded and written tensor by tensor (--jobs at once).
    """
    from ..budget import Budget
    from ..export import ship
    from ..io import _discard, check_writable

    if fit_bytes is not None and max_bytes is not None and fit_bytes > max_bytes:
        raise click.UsageError(
            f"--fit {fit_bytes:,} is over --max-bytes {max_bytes:,}: the fitted artifact would be refused; "
            "lower --fit or raise --max-bytes (without --max-bytes, --fit BYTES is the cap)"
        )
    policy = policy_from_options(quant, policy_file, keep_float, quantize_controls, keep_float_max_numel)
    formats = None
    if fit_formats is not None:  # (fit.py imports torch: a pack that streams floats needs none)
        from ..export.fit import parse_formats

        formats = parse_formats(fit_formats)
    for given, flag in ((fit_formats is not None, "--fit-formats"), (fit_embeddings, "--fit-embeddings")):
        if given and fit_bytes is None:
            raise click.UsageError(f"{flag} only applies with --fit BYTES")
    out = out or _default_out(ckpt)
    check_writable(out, force, _inputs(ckpt, *code_files, *([loader] if loader else [])))
    cap = max_bytes or fit_bytes or DEFAULT_MAX_BYTES
    budget = Budget(max_bytes=cap, code_files=list(code_files), loader=loader)
    budget.code_total()  # a bad --code fails now, before any work
    progress = None if as_json else (lambda msg: echo(msg, err=True))
    packed = ship.ship(
        ckpt,
        policy,
        effort=effort,
        fit_bytes=None if fit_bytes is None else budget.with_cap(fit_bytes),
        fit_formats=formats,
        gptq=gptq,
        hessians_file=hessians_file,
        calib_data=calib_data,
        tokenizer=tokenizer,
        calib_tokens=calib_tokens,
        model_factory=model_factory,
        sensitivity=fit_sensitivity,
        fit_embeddings=fit_embeddings,
        progress=progress,
        max_decoded_bytes=max_decoded_bytes,
        out=out,
        jobs=default_jobs(jobs),
    )
    try:
        _finish_pack(ckpt, packed, out, budget, fit_bytes, force, as_json, effort, progress)
    finally:
        if packed.temp is not None:
            _discard(packed.temp)  # (published: gone already)


# Over the cap, the hint packs the checkpoint again in memory, at several formats: a streamed
# one past this size is not (minutes, and the memory streaming saved); the error says the cap.
HINT_MAX_CHECKPOINT_BYTES = 1 << 28


def _finish_pack(ckpt, packed, out, budget, fit_bytes, force, as_json, effort, progress) -> None:
    """Check the cap, then write the artifact (or publish its temp file) and the report."""
    from ..io import atomic_write_bytes, publish
    from . import tables

    data, rows = packed.data, packed.rows
    if not as_json:
        say_notes(packed.notes, budget)
    try:
        cap = budget.check(len(data), rows)
    except OverCapError as exc:
        # Refuse to write: show where the bytes go, and what would fit, so the user can act.
        hint, state = None, packed.state
        if state is None and sum(f.stat().st_size for f in _inputs(ckpt) if f.is_file()) <= HINT_MAX_CHECKPOINT_BYTES:
            from ..export.pack import load_state

            state = load_state(ckpt)[0]
        if fit_bytes is None and state is not None:
            from ..export.hint import over_cap_hint

            if progress:
                progress("over the cap: estimating what would fit")
            meta = {k: v for k, v in packed.metadata.items() if k != "export"}
            hint = over_cap_hint(state, packed.policy, budget, rows, len(data), metadata=meta, effort=effort)
        if as_json:
            _echo_json({**exc.report, "policy": packed.policy_line, **(hint.to_dict() if hint else {"hint": None})})
        else:
            echo(tables.tensor_table(rows, limit=15), err=True)
            echo(tables.totals_lines(rows, exc.report), err=True)
            echo(packed.policy_line, err=True)
        raise OverCapError(
            f"not written: {exc}" + (f"; {hint.text.removeprefix('hint: ')}" if hint else ""), exc.report
        ) from None
    if packed.temp is not None:
        publish(packed.temp, out, exclusive=not force)
    else:
        atomic_write_bytes(out, data, exclusive=not force)  # no-clobber as the file appears, too
    cap["path"] = str(out)
    cap["policy"] = packed.policy_line
    if packed.fit is not None:
        cap["fit"] = packed.fit.to_dict()
    if as_json:
        _echo_json(cap)
    else:
        echo(tables.tensor_table(rows, limit=15))
        echo(tables.totals_lines(rows, cap))
        if packed.fit is not None:
            echo(packed.fit.lines())
        echo(packed.policy_line)
        echo(f"wrote {out} ({len(data):,} bytes)")


@click.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="output .safetensors")
@click.option("--force", is_flag=True, help="overwrite OUT (and config.json beside it)")
@DECODED_OPTION
@jobs_option("tensors decoded")
def unpack(artifact, out, force, max_decoded_bytes, jobs):
    """Decode an artifact to dequantized weights (+ config.json beside them)."""
    from contextlib import closing

    from ..budget import api, safetensors_out
    from ..io import WriteBehind, atomic_write_many, check_distinct, check_writable
    from ..quant import registry as quant_registry

    check_writable(out, force, [artifact])
    data = api.read_artifact_file(artifact, max_decoded_bytes)
    placer = _Placer()
    manifest, tensors = api.iter_artifact(data, max_decoded_bytes, placer, default_jobs(jobs))
    config = manifest.get("metadata", {}).get("config")
    cfg_path = out.with_name("config.json")
    if config is not None:
        check_distinct({"-o": out, "the config.json written beside it": cfg_path})
        check_writable(cfg_path, force, [artifact])
    # Tensor by tensor into the file (a tied name gets its own copy in the file, not in RAM), each
    # written by the job that decoded it; both files to temp names first, then renamed: a failure
    # leaves the old pair as it was.
    entries = {t["name"]: t for t in manifest["tensors"]}
    stored = {n: entries[t.get("alias_of", n)] for n, t in entries.items() if n not in factors_of(manifest)}
    specs = {n: (quant_registry.known_dtype(t["dtype"]), t["shape"]) for n, t in stored.items()}
    if not all(_as_words(t["format"], t["dtype"], t.get("lowrank")) for t in stored.values()):
        import torch  # noqa: F401  (here, before jobs fork: else each would import it again)
    placer.names = {}  # stored tensor -> its names (with its aliases)
    for n, t in stored.items():
        placer.names.setdefault(t["name"], []).append(n)
    placer.layout = safetensors_out.Layout(specs)

    def write(f):
        f.write(placer.layout.head)
        f.flush()
        placer.file, placer.behind = f, WriteBehind(f)  # (before the first tensor: the jobs fork then)
        for _ in tensors:
            pass
        placer.behind.flush()  # (one job: this process's syncs done before the file closes)
        f.truncate(placer.layout.size)

    parts = [(out, write)]
    if config is not None:
        text = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
        parts.append((cfg_path, lambda f: f.write(text)))
    with closing(tensors):
        atomic_write_many(parts, exclusive=not force)
    echo(f"wrote {out} ({len(specs)} tensors){' and ' + str(cfg_path) if config is not None else ''}")


class _Placer:
    """Dequantizes a decoded tensor and writes it at its places in unpack's output, in the job
    that decoded it: nothing but its name crosses back (2.2 GB of a 1.1B-weight model did)."""

    file = behind = layout = names = None  # (set by unpack before the first tensor; behind: a copy in each job)

    def __call__(self, entries: list[dict], qt):
        import numpy as np

        from ..budget.safetensors_out import raw_bytes
        from ..io import write_at
        from ..quant.registry import dequantize, dtype_name, itemsize, word_blocks

        if qt is None:  # an alias: written with the tensor it names
            return None, []
        if _as_words(qt.format, qt.dtype, qt.lowrank):  # (the rule unpack applied to the manifest)
            dtype, pieces = qt.dtype, word_blocks(qt)
        else:
            t = dequantize(qt, original_dtype=True)
            dtype, pieces = dtype_name(t.dtype), [raw_bytes(t)]
        name = entries[-1]["name"]
        at = self.layout.positions(self.names[name], dtype, qt.numel * itemsize(dtype))
        for piece in pieces:  # (each where the last ended, at each place)
            data = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
            for pos in at:
                write_at(self.file, pos, data)
                self.behind.done(pos, data.size)
            at = [pos + data.size for pos in at]
        return name, []


def _as_words(fmt: str, dtype: str, lowrank) -> bool:
    """Whether a stored tensor's bytes in the output are made with numpy (Quantizer.word_blocks:
    float formats, raw integers, integer grids and NF4 restored to a float dtype): no torch,
    whose import took ~0.9 s of every unpack (and its exit ~0.3 s)."""
    from ..quant.registry import makes_words

    return not lowrank and makes_words(fmt, dtype)


def factors_of(manifest: dict) -> set[str]:
    """The names of LQER factor entries (stored beside their tensor, not tensors of the model)."""
    return {n for t in manifest["tensors"] for n in t.get("lowrank", ())}


OUT_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command()
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@MAX_BYTES_OPTION
@budget_options
@click.option("--json", "as_json", is_flag=True, help="print the JSON report to stdout")
@click.option("--report", "report_path", type=OUT_FILE, help="write the JSON report to FILE")
@click.option("--junit", "junit_path", type=OUT_FILE, help="write JUnit XML (one testcase per check) to FILE")
@click.option(
    "--summary", "summary_path", type=OUT_FILE, help="append a Markdown summary to FILE ($GITHUB_STEP_SUMMARY)"
)
@click.option(
    "--reference", type=click.Path(exists=True, path_type=Path), help="reference checkpoint: run the loss gate"
)
@click.option(
    "--data", default="default", show_default=True, help="loss gate data: default, a text path or shards:GLOB"
)
@click.option("--tokenizer", default=None, help="SentencePiece model of the data (bits per byte on shards)")
@click.option(
    "--max-loss-delta",
    type=float,
    default=None,
    help="allowed bpb increase over the reference (needed with --reference)",
)
@click.option(
    "--model-factory",
    default=None,
    metavar="MODULE:FUNCTION",
    help="build foreign models with FUNCTION(config or None) -> nn.Module (forward(x) -> logits, "
    "or forward(x, y) -> mean loss; context length in model.seq_len); imports and runs that code",
)
@click.option("--force", is_flag=True, help="overwrite an existing --report/--junit file (never an input)")
@DECODED_OPTION
@jobs_option("tensors decoded")
def verify(
    artifacts,
    max_bytes,
    code_files,
    loader,
    as_json,
    report_path,
    junit_path,
    summary_path,
    reference,
    data,
    tokenizer,
    max_loss_delta,
    model_factory,
    force,
    max_decoded_bytes,
    jobs,
):
    """Integrity, byte cap and (with --reference) loss gate for each artifact.

    Exit 0 when every check passes; otherwise the first of 4 corrupt, 3 over the
    cap, 5 loss regression, 1 other error that any artifact hit.
    """
    from ..budget import Budget, verify_artifact
    from ..errors import LossRegressionError, RecurnormError
    from ..io import atomic_write_json, atomic_write_text, check_appendable, check_distinct, check_writable, same_file
    from . import ci_report, exitcodes

    if reference is None:
        for flag, value in (
            ("--max-loss-delta", max_loss_delta),
            ("--tokenizer", tokenizer),
            ("--model-factory", model_factory),
        ):
            if value is not None:
                raise click.UsageError(f"{flag} only applies to the loss gate: pass --reference too")
    elif max_loss_delta is None:
        raise click.UsageError("--reference needs --max-loss-delta (the allowed bpb increase)")
    elif not max_loss_delta >= 0:
        raise click.BadParameter(f"must be >= 0, got {max_loss_delta}", param_hint="--max-loss-delta")
    # Outputs are checked before any work: a clash must not cost a long loss gate.
    inputs = _inputs(
        *artifacts, *code_files, *([loader] if loader else []), *([reference] if reference is not None else [])
    )
    check_distinct({"--report": report_path, "--junit": junit_path, "--summary": summary_path})
    for path in (report_path, junit_path):
        if path is not None:
            check_writable(path, force, inputs)
    if summary_path is not None:  # appended to ($GITHUB_STEP_SUMMARY exists): never an input
        check_appendable(summary_path)  # a regular file, or /dev/null; never a FIFO (it would block)
        if not same_file(summary_path, os.devnull):
            check_writable(summary_path, True, inputs)
    budget = Budget(max_bytes=max_bytes, code_files=list(code_files), loader=loader)
    budget.code_total()  # a bad --code: a usage error, up front
    factory = None
    if model_factory is not None:
        from ..model.factory import load_factory

        factory = load_factory(model_factory)  # fail before any artifact work on a bad spec

    corpus = None
    outcomes = []
    for artifact in artifacts:
        out = ci_report.Outcome(
            verify_artifact(artifact, budget, max_decoded_bytes, default_jobs(jobs)),
            gate_requested=reference is not None,
        )
        if reference is not None and out.report.exit_code != exitcodes.CORRUPT:
            from ..evaluate.gate import loss_gate
            from ..train.data import load_corpus

            try:
                # Loaded once for all artifacts; a bad --data is reported per artifact like any gate error.
                corpus = corpus if corpus is not None else load_corpus(data, tokenizer=tokenizer)
                out.gate = loss_gate(artifact, reference, corpus, max_loss_delta, model_factory=factory).to_dict()
            except LossRegressionError as exc:
                out.gate, out.gate_code, out.gate_error = exc.report.to_dict(), exitcodes.LOSS_REGRESSION, str(exc)
            except RecurnormError as exc:
                out.gate_code, out.gate_error = exitcodes.for_error(exc), str(exc)
        out.build_checks()
        outcomes.append(out)
        if not as_json:
            _print_outcome(out)

    doc = ci_report.to_json(outcomes)
    if report_path is not None:
        atomic_write_json(report_path, doc, exclusive=not force)
    if junit_path is not None:
        atomic_write_text(junit_path, ci_report.junit_xml(outcomes), exclusive=not force)
    if summary_path is not None:
        ci_report.append_text(summary_path, ci_report.markdown_summary(outcomes))
    if as_json:
        _echo_json(doc)
    click.get_current_context().exit(doc["exit_code"])


def _print_outcome(out) -> None:
    """Human lines for one artifact: totals and ok, or one error line (plus the table when over cap)."""
    from ..display import printable
    from .ci_report import gate_line
    from .exitcodes import OK
    from .tables import tensor_table, totals_lines

    rep = out.report
    path = printable(rep.path)
    if out.exit_code == OK:
        echo(totals_lines(rep.tensors, rep.cap))
        if out.gate:
            echo(f"loss gate: {gate_line(out.gate)}")
        echo(f"ok: {path}: {rep.reason}{'; loss within the allowed delta' if out.gate else ''}")
        return
    if rep.exit_code == OVER_CAP and rep.tensors:  # (over --max-decoded-bytes: nothing decoded to show)
        echo(tensor_table(rep.tensors, limit=15), err=True)
    echo(f"error: {path}: {printable(rep.reason if rep.exit_code != OK else out.gate_error)}", err=True)
    if rep.exit_code == OVER_CAP and out.gate_error:
        echo(f"error: {path}: {printable(out.gate_error)}", err=True)


@click.command(cls=PolicyCommand)
@click.argument("target", type=click.Path(exists=True, path_type=Path))
@policy_options
@MAX_BYTES_OPTION
@budget_options
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@DECODED_OPTION
@jobs_option("tensors coded or decoded")
def inspect(
    target,
    quant,
    policy_file,
    keep_float,
    quantize_controls,
    keep_float_max_numel,
    max_bytes,
    code_files,
    loader,
    as_json,
    max_decoded_bytes,
    jobs,
):
    """Per-tensor bytes, bits/weight, order-0 bound and the rule that chose each format.

    TARGET is an artifact, or a checkpoint packed under the policy options as pack packs it
    (a .safetensors one tensor by tensor, into a temporary file that goes after). The budget
    line counts --code and --loader as pack and verify do (the same numbers).
    """
    from ..budget import Budget, api
    from ..export.record import rows_with_rules, rules_table  # (no torch: an artifact is read as verify reads it)
    from . import tables

    budget = Budget(max_bytes=max_bytes, code_files=list(code_files), loader=loader)
    budget.code_total()  # a bad --code: a usage error, up front
    notes = []
    if _is_artifact(target):
        data = api.read_artifact_file(target, max_decoded_bytes)
        rows, metadata = rows_with_rules(data, max_decoded_bytes, default_jobs(jobs))
        size = len(data)
    elif target.suffix == ".rnpk":
        raise ArtifactError(f"{target}: not a recurnorm artifact (bad magic)")
    else:
        from ..export import ship

        policy = policy_from_options(quant, policy_file, keep_float, quantize_controls, keep_float_max_numel)
        with tempfile.TemporaryDirectory(prefix="recurnorm-inspect-") as tmp:  # (where a streamed pack writes)
            out = Path(tmp) / "inspect.rnpk"
            packed = ship.ship(target, policy, out=out, jobs=default_jobs(jobs), max_decoded_bytes=max_decoded_bytes)
            size, rows, metadata, notes = len(packed.data), packed.rows, packed.metadata, packed.notes
            # (data maps the temp file, which Windows removes only once closed; in-memory: bytes)
            with contextlib.suppress(AttributeError, BufferError):
                packed.data.close()
    cap = budget.report(size, rows)
    if not as_json:
        say_notes(notes, budget)
    if as_json:
        _echo_json({"path": str(target), "cap": cap, "tensors": rows, "metadata": metadata})
        return
    echo(tables.tensor_table(rows))
    echo(tables.totals_lines(rows, cap))
    echo("")
    echo(rules_table(rows))
    policy_line = (metadata.get("export") or {}).get("policy")
    if policy_line:
        echo(policy_line)
