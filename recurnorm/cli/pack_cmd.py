"""pack / unpack / verify / inspect: thin click wrappers over recurnorm.budget."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ArtifactError, CheckpointError, OverCapError
from .exitcodes import OVER_CAP

MAX_BYTES_HELP = "byte cap (decimal), counting the artifact plus --code files and --loader"
CAP = click.IntRange(min=1)  # a cap of 0 or less is a mistake, not a request
CODE_HELP = "code file (or folder of .py files) counted against the cap; regular files only"
LOADER_HELP = "the artifact's loader (recurnorm loader -o FILE): counted against the cap like code"
DECODED_OPTION = click.option(
    "--max-decoded-bytes", type=CAP, default=None,
    help="refuse artifacts whose tensors decode to more bytes than this [default: 1 GiB]; "
         "checked before decoding, so a small hostile file cannot take the machine's memory")


def _inputs(*paths) -> list[Path]:
    """Files a command reads, which its outputs must never replace."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        out.append(p)
        if p.is_dir():
            out += [p / "model.safetensors", p / "config.json"]
    return out


def _echo_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


def _is_artifact(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"RNPK"


def _policy(quant: str, keep_float_max_numel: int | None, quantize_controls: bool):
    from ..quant.policy import ExportPolicy

    kw = {"quantizer": quant, "quantize_controls": quantize_controls}
    if keep_float_max_numel is not None:
        kw["keep_float_max_numel"] = keep_float_max_numel
    return ExportPolicy(**kw)


def _pack_checkpoint(ckpt: Path, quant: str, keep_float_max_numel, quantize_controls,
                     effort: str = "normal"):
    """(artifact bytes, stats rows) for a checkpoint."""
    from ..budget import api

    state, config = api.load_checkpoint_state(ckpt)
    policy = _policy(quant, keep_float_max_numel, quantize_controls)
    qat = (config or {}).get("qat")
    if qat is not None and not isinstance(qat, dict):
        raise CheckpointError(f"{ckpt}: config.json field qat must be an object, got {type(qat).__name__}")
    if qat and not qat.get("exported", False):
        # A QAT checkpoint ships exactly the codes its training saw: its
        # projections use the recorded QAT quantizer, whatever -q says.
        from ..model import ModelConfig
        from ..train.qat import export_config, qat_policy

        model_config = ModelConfig.from_dict(config)
        policy = qat_policy(model_config, base=policy)
        config = export_config(model_config)
    small = [n for n, (_, _, why) in policy.plan(state).items() if why.startswith("small")]
    if small:
        # The Parameter Golf default keeps small matrices in float: say so, since
        # on a tiny model it means -q touches almost nothing.
        click.echo(f"note: {len(small)} float tensors of <= {policy.keep_float_max_numel:,} "
                   "elements kept as fp16 (--keep-float-max-numel 0 quantizes them too)", err=True)
    qts = api.export_qtensors(state, quant, policy)
    metadata = {"quant": quant, "source": ckpt.name}
    if config is not None:
        metadata["config"] = config
    data = api.pack_qtensors(qts, metadata, effort=effort)
    manifest = api.read_artifact(data)  # decode once: proves the round trip and gives bounds
    return data, api.tensor_stats(manifest.manifest, manifest.qtensors)


@click.command()
@click.argument("ckpt", type=click.Path(exists=True, path_type=Path))
@click.option("-q", "--quant", "quant", default="int8", show_default=True, help="main quantizer format")
@click.option("-o", "--out", type=click.Path(path_type=Path), help="artifact path (default: CKPT stem + .rnpk)")
@click.option("--max-bytes", type=CAP, default=16_000_000, show_default=True, help=MAX_BYTES_HELP)
@click.option("--code", "code_files", multiple=True, type=click.Path(exists=True), help=CODE_HELP)
@click.option("--loader", "loader", type=click.Path(exists=True, dir_okay=False), help=LOADER_HELP)
@click.option("--force", is_flag=True, help="overwrite OUT (never the checkpoint itself)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--quantize-controls", is_flag=True, help="quantize gains/gates too (fragility probe)")
@click.option("--keep-float-max-numel", type=int, default=None, help="float tensors this small stay fp16")
@click.option("--effort", type=click.Choice(["normal", "max"]), default="normal", show_default=True,
              help="codec search: max tries every context size and zstd layout at its slow level "
                   "for the last bytes (several times slower; the artifact reads the same)")
def pack(ckpt, quant, out, max_bytes, code_files, loader, force, as_json, quantize_controls,
         keep_float_max_numel, effort):
    """Quantize and entropy-pack any checkpoint into one .rnpk artifact."""
    from ..budget import Budget, report
    from ..budget.cap import code_bytes
    from ..io import atomic_write_bytes, check_writable

    out = out or ckpt.with_name((ckpt.stem if ckpt.is_file() else ckpt.name) + ".rnpk")
    check_writable(out, force, _inputs(ckpt, *code_files, *([loader] if loader else [])))
    code_bytes([*code_files, *([loader] if loader else [])], max_bytes)  # a bad --code fails now
    budget = Budget(max_bytes=max_bytes, code_files=list(code_files), loader=loader)
    data, rows = _pack_checkpoint(ckpt, quant, keep_float_max_numel, quantize_controls, effort)
    try:
        cap = budget.check(len(data), rows)
    except OverCapError as exc:
        # Refuse to write: show where the bytes go so the user can act.
        if as_json:
            _echo_json(exc.report)
        else:
            click.echo(report.tensor_table(rows, limit=15), err=True)
            click.echo(report.totals_lines(rows, exc.report), err=True)
        raise OverCapError(f"not written: {exc}", exc.report) from None
    atomic_write_bytes(out, data)
    cap["path"] = str(out)
    if as_json:
        _echo_json(cap)
    else:
        click.echo(report.tensor_table(rows, limit=15))
        click.echo(report.totals_lines(rows, cap))
        click.echo(f"wrote {out} ({len(data):,} bytes)")


@click.command()
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="output .safetensors")
@click.option("--force", is_flag=True, help="overwrite OUT (and config.json beside it)")
@DECODED_OPTION
def unpack(artifact, out, force, max_decoded_bytes):
    """Decode an artifact to dequantized weights (+ config.json beside them)."""
    from ..budget import api, safetensors_out
    from ..io import atomic_write_json, atomic_write_stream, check_writable

    check_writable(out, force, [artifact])
    art = api.read_artifact(api.read_artifact_file(artifact, max_decoded_bytes), max_decoded_bytes)
    config = art.metadata.get("config")
    cfg_path = out.with_name("config.json")
    if config is not None:
        check_writable(cfg_path, force, [artifact])
    tensors = api.dequantize_all(art.qtensors)
    # Written from the tensors' memory (tied names get their own copy in the file, not in RAM).
    atomic_write_stream(out, lambda f: safetensors_out.write(f, tensors))
    if config is not None:
        atomic_write_json(cfg_path, config)
    click.echo(f"wrote {out} ({len(tensors)} tensors){' and ' + str(cfg_path) if config is not None else ''}")


OUT_FILE = click.Path(dir_okay=False, path_type=Path)


@click.command()
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--max-bytes", type=CAP, default=16_000_000, show_default=True, help=MAX_BYTES_HELP)
@click.option("--code", "code_files", multiple=True, type=click.Path(exists=True), help=CODE_HELP)
@click.option("--loader", "loader", type=click.Path(exists=True, dir_okay=False), help=LOADER_HELP)
@click.option("--json", "as_json", is_flag=True, help="print the JSON report to stdout")
@click.option("--report", "report_path", type=OUT_FILE, help="write the JSON report to FILE")
@click.option("--junit", "junit_path", type=OUT_FILE, help="write JUnit XML (one testcase per check) to FILE")
@click.option("--summary", "summary_path", type=OUT_FILE, help="append a Markdown summary to FILE ($GITHUB_STEP_SUMMARY)")
@click.option("--reference", type=click.Path(exists=True, path_type=Path), help="reference checkpoint: run the loss gate")
@click.option("--data", default="default", show_default=True, help="loss gate data: default, a text path or shards:GLOB")
@click.option("--tokenizer", default=None, help="SentencePiece model of the data (bits per byte on shards)")
@click.option("--max-loss-delta", type=float, default=None, help="allowed bpb increase over the reference (needed with --reference)")
@click.option("--model-factory", default=None, metavar="MODULE:FUNCTION",
              help="build foreign models with FUNCTION(config or None) -> nn.Module; imports and runs that code")
@click.option("--force", is_flag=True, help="overwrite an existing --report/--junit file (never an input)")
@DECODED_OPTION
def verify(artifacts, max_bytes, code_files, loader, as_json, report_path, junit_path, summary_path,
           reference, data, tokenizer, max_loss_delta, model_factory, force, max_decoded_bytes):
    """Integrity, byte cap and (with --reference) loss gate for each artifact.

    Exit 0 when every check passes; otherwise the first of 4 corrupt, 3 over the
    cap, 5 loss regression, 1 other error that any artifact hit.
    """
    from ..budget import Budget, report, verify_artifact
    from ..budget.cap import code_bytes
    from ..errors import LossRegressionError, RecurnormError
    from ..io import atomic_write_json, atomic_write_text, check_writable
    from . import ci_report, exitcodes

    if reference is None:
        for flag, value in (("--max-loss-delta", max_loss_delta), ("--tokenizer", tokenizer),
                            ("--model-factory", model_factory)):
            if value is not None:
                raise click.UsageError(f"{flag} only applies to the loss gate: pass --reference too")
    elif max_loss_delta is None:
        raise click.UsageError("--reference needs --max-loss-delta (the allowed bpb increase)")
    elif not max_loss_delta >= 0:
        raise click.BadParameter(f"must be >= 0, got {max_loss_delta}", param_hint="--max-loss-delta")
    # Outputs are checked before any work: a clash must not cost a long loss gate.
    inputs = _inputs(*artifacts, *code_files, *([reference] if reference is not None else []))
    for path in (report_path, junit_path):
        if path is not None:
            check_writable(path, force, inputs)
    if summary_path is not None:  # appended to ($GITHUB_STEP_SUMMARY exists): never an input
        check_writable(summary_path, True, inputs)
    code_bytes([*code_files, *([loader] if loader else [])], max_bytes)  # a bad --code: a usage error, up front
    factory = None
    if model_factory is not None:
        from ..evaluate.factory import load_factory

        factory = load_factory(model_factory)  # fail before any artifact work on a bad spec

    budget = Budget(max_bytes=max_bytes, code_files=list(code_files), loader=loader)
    corpus = None
    outcomes = []
    for artifact in artifacts:
        out = ci_report.Outcome(verify_artifact(artifact, budget, max_decoded_bytes),
                                gate_requested=reference is not None)
        if reference is not None and out.report.exit_code != exitcodes.CORRUPT:
            from ..evaluate.gate import loss_gate
            from ..train.data import load_corpus

            try:
                # Loaded once for all artifacts; a bad --data is reported per artifact like any gate error.
                corpus = corpus if corpus is not None else load_corpus(data, tokenizer=tokenizer)
                out.gate = loss_gate(artifact, reference, corpus, max_loss_delta,
                                     model_factory=factory).to_dict()
            except LossRegressionError as exc:
                out.gate, out.gate_code, out.gate_error = exc.report.to_dict(), exitcodes.LOSS_REGRESSION, str(exc)
            except RecurnormError as exc:
                out.gate_code, out.gate_error = exitcodes.for_error(exc), str(exc)
        out.build_checks()
        outcomes.append(out)
        if not as_json:
            _print_outcome(out, report)

    doc = ci_report.to_json(outcomes)
    if report_path is not None:
        atomic_write_json(report_path, doc)
    if junit_path is not None:
        atomic_write_text(junit_path, ci_report.junit_xml(outcomes))
    if summary_path is not None:
        ci_report.append_text(summary_path, ci_report.markdown_summary(outcomes))
    if as_json:
        _echo_json(doc)
    click.get_current_context().exit(doc["exit_code"])


def _print_outcome(out, report) -> None:
    """Human lines for one artifact: totals and ok, or one error line (plus the table when over cap)."""
    from ..display import printable
    from .ci_report import gate_line
    from .exitcodes import OK

    rep = out.report
    path = printable(rep.path)
    if out.exit_code == OK:
        click.echo(report.totals_lines(rep.tensors, rep.cap))
        if out.gate:
            click.echo(f"loss gate: {gate_line(out.gate)}")
        click.echo(f"ok: {path}: {rep.reason}{'; loss within the allowed delta' if out.gate else ''}")
        return
    if rep.exit_code == OVER_CAP:
        click.echo(report.tensor_table(rep.tensors, limit=15), err=True)
    click.echo(f"error: {path}: {printable(rep.reason if rep.exit_code != OK else out.gate_error)}", err=True)
    if rep.exit_code == OVER_CAP and out.gate_error:
        click.echo(f"error: {path}: {printable(out.gate_error)}", err=True)


@click.command()
@click.argument("target", type=click.Path(exists=True, path_type=Path))
@click.option("-q", "--quant", "quant", default="int8", show_default=True, help="quantizer for a checkpoint")
@click.option("--max-bytes", type=CAP, default=16_000_000, show_default=True, help=MAX_BYTES_HELP)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--loader", "loader", type=click.Path(exists=True, dir_okay=False),
              help="count this loader file (default: the compact loader's bytes, as shipped)")
@DECODED_OPTION
def inspect(target, quant, max_bytes, as_json, loader, max_decoded_bytes):
    """Per-tensor bytes, bits/weight and order-0 bound of an artifact (or a checkpoint, packed in
    memory), and the budget line counting the loader that ships with it."""
    from ..budget import Budget, api, report

    if _is_artifact(target):
        data = api.read_artifact_file(target, max_decoded_bytes)
        art = api.read_artifact(data, max_decoded_bytes)
        rows = api.tensor_stats(art.manifest, art.qtensors)
        metadata = art.metadata
    elif target.suffix == ".rnpk":
        raise ArtifactError(f"{target}: not a recurnorm artifact (bad magic)")
    else:
        data, rows = _pack_checkpoint(target, quant, None, False)
        metadata = {}
    from ..budget.loader import loader_source

    budget = Budget(max_bytes=max_bytes, loader=loader or len(loader_source(compact=True).encode()))
    try:
        cap = budget.check(len(data), rows)
    except OverCapError as exc:
        cap = exc.report
    if as_json:
        _echo_json({"path": str(target), "cap": cap, "tensors": rows, "metadata": metadata})
        return
    click.echo(report.tensor_table(rows))
    click.echo(report.totals_lines(rows, cap))
