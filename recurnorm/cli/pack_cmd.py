"""pack / unpack / verify / inspect: thin click wrappers over recurnorm.budget."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ArtifactError, OverCapError
from .exitcodes import OVER_CAP

MAX_BYTES_HELP = "byte cap (decimal), counting the artifact plus --code files"


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


def _pack_checkpoint(ckpt: Path, quant: str, keep_float_max_numel, quantize_controls):
    """(artifact bytes, stats rows) for a checkpoint."""
    from ..budget import api

    state, config = api.load_checkpoint_state(ckpt)
    policy = _policy(quant, keep_float_max_numel, quantize_controls)
    qts = api.export_qtensors(state, quant, policy)
    metadata = {"quant": quant, "source": ckpt.name}
    if config is not None:
        metadata["config"] = config
    data = api.pack_qtensors(qts, metadata)
    manifest = api.read_artifact(data)  # decode once: proves the round trip and gives bounds
    return data, api.tensor_stats(manifest.manifest, manifest.qtensors)


@click.command()
@click.argument("ckpt", type=click.Path(exists=True, path_type=Path))
@click.option("-q", "--quant", "quant", default="int8", show_default=True, help="main quantizer format")
@click.option("-o", "--out", type=click.Path(path_type=Path), help="artifact path (default: CKPT stem + .rnpk)")
@click.option("--max-bytes", type=int, default=16_000_000, show_default=True, help=MAX_BYTES_HELP)
@click.option("--code", "code_files", multiple=True, type=click.Path(exists=True), help="code file counted against the cap")
@click.option("--force", is_flag=True, help="overwrite OUT")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option("--quantize-controls", is_flag=True, help="quantize gains/gates too (fragility probe)")
@click.option("--keep-float-max-numel", type=int, default=None, help="float tensors this small stay fp16")
def pack(ckpt, quant, out, max_bytes, code_files, force, as_json, quantize_controls, keep_float_max_numel):
    """Quantize and entropy-pack any checkpoint into one .rnpk artifact."""
    from ..budget import Budget, report
    from ..io import atomic_write_bytes, check_writable

    out = out or ckpt.with_name((ckpt.stem if ckpt.is_file() else ckpt.name) + ".rnpk")
    check_writable(out, force)
    data, rows = _pack_checkpoint(ckpt, quant, keep_float_max_numel, quantize_controls)
    budget = Budget(max_bytes=max_bytes, code_files=list(code_files))
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
def unpack(artifact, out, force):
    """Decode an artifact to dequantized weights (+ config.json beside them)."""
    from safetensors.torch import save

    from ..budget import api
    from ..io import atomic_write_bytes, atomic_write_json, check_writable

    check_writable(out, force)
    art = api.read_artifact(artifact.read_bytes())
    config = art.metadata.get("config")
    cfg_path = out.with_name("config.json")
    if config is not None:
        check_writable(cfg_path, force)
    tensors = api.dequantize_all(art.qtensors)
    # safetensors refuses shared storage: tied weights are written as separate copies.
    seen: set[int] = set()
    flat = {}
    for name in sorted(tensors):
        t = tensors[name]
        flat[name] = t.clone() if id(t) in seen else t.contiguous()
        seen.add(id(t))
    atomic_write_bytes(out, save(flat))
    if config is not None:
        atomic_write_json(cfg_path, config)
    click.echo(f"wrote {out} ({len(flat)} tensors){' and ' + str(cfg_path) if config is not None else ''}")


@click.command()
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--max-bytes", type=int, default=16_000_000, show_default=True, help=MAX_BYTES_HELP)
@click.option("--code", "code_files", multiple=True, type=click.Path(exists=True), help="code file counted against the cap")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def verify(artifact, max_bytes, code_files, as_json):
    """Exit 0 if the artifact decodes with every checksum and fits the cap; 3 over cap; 4 corrupt."""
    from ..budget import Budget, report, verify_artifact

    rep = verify_artifact(artifact, Budget(max_bytes=max_bytes, code_files=list(code_files)))
    if as_json:
        _echo_json(rep.to_dict())
    elif rep.exit_code == 0:
        click.echo(report.totals_lines(rep.tensors, rep.cap))
        click.echo(f"ok: {artifact}: {rep.reason}")
    else:
        if rep.exit_code == OVER_CAP:
            click.echo(report.tensor_table(rep.tensors, limit=15), err=True)
        click.echo(f"error: {artifact}: {rep.reason}", err=True)
    click.get_current_context().exit(rep.exit_code)


@click.command()
@click.argument("target", type=click.Path(exists=True, path_type=Path))
@click.option("-q", "--quant", "quant", default="int8", show_default=True, help="quantizer for a checkpoint")
@click.option("--max-bytes", type=int, default=16_000_000, show_default=True, help=MAX_BYTES_HELP)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def inspect(target, quant, max_bytes, as_json):
    """Per-tensor bytes, bits/weight and order-0 bound of an artifact (or a checkpoint, packed in memory)."""
    from ..budget import Budget, api, report

    if _is_artifact(target):
        data = target.read_bytes()
        art = api.read_artifact(data)
        rows = api.tensor_stats(art.manifest, art.qtensors)
        metadata = art.metadata
    elif target.suffix == ".rnpk":
        raise ArtifactError(f"{target}: not a recurnorm artifact (bad magic)")
    else:
        data, rows = _pack_checkpoint(target, quant, None, False)
        metadata = {}
    budget = Budget(max_bytes=max_bytes)
    try:
        cap = budget.check(len(data), rows)
    except OverCapError as exc:
        cap = exc.report
    if as_json:
        _echo_json({"path": str(target), "cap": cap, "tensors": rows, "metadata": metadata})
        return
    click.echo(report.tensor_table(rows))
    click.echo(report.totals_lines(rows, cap))
