"""Checkpoints and artifacts back to tensors and models: the one place an artifact becomes a model.

A QAT checkpoint is loaded as the model it is (fake quant re-applied at λ = 1);
a model rebuilt from an artifact already holds the grid weights and gets only
the activation hooks (re-quantizing dequantized weights is not a fixed point).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ..budget import format as fmt
from ..budget import spec
from ..errors import ArtifactError, CheckpointError, ConfigError

if TYPE_CHECKING:
    from torch import nn


def prepare_exported(model: nn.Module) -> nn.Module:
    """Finish a model rebuilt from an artifact: activation hooks only, never weight fake quant."""
    from ..train.qat import apply_qat

    if getattr(model.config, "qat", None):
        apply_qat(model, {**model.config.qat, "exported": True})
    return model


def read_artifact_bytes(artifact: str | os.PathLike | bytes | bytearray) -> bytes:
    """The bytes of an artifact given as bytes or a path (budget's checked file reader)."""
    from ..budget.api import read_artifact_file

    if isinstance(artifact, (bytes, bytearray, memoryview)):
        return bytes(artifact)
    return read_artifact_file(artifact)


def model_from_decoded(art, source: str = "artifact") -> nn.Module:
    """A fresh RecurrentLM from a decoded budget Artifact (config in metadata, strict load)."""
    from ..model import model_from_state_dict
    from ..quant import dequantize_all

    config = art.metadata.get("config")
    if not isinstance(config, dict):
        raise ArtifactError(f"{source} has no model config in its metadata; cannot rebuild the model")
    try:
        # Grid weights are never fake-quantized again; a QAT model's activation hooks are restored.
        return prepare_exported(model_from_state_dict(config, dequantize_all(art.qtensors), source=source))
    except (CheckpointError, ConfigError) as exc:
        # Tensors (or a qat record) that disagree with the artifact's own config: the artifact is at fault.
        raise ArtifactError(f"{source}: {exc}") from None


def model_from_artifact(artifact: str | os.PathLike | bytes, source: str | None = None) -> nn.Module:
    """A fresh RecurrentLM rebuilt from an artifact (bytes or path) alone."""
    from ..budget.api import read_artifact

    if source is None:
        source = "artifact" if isinstance(artifact, (bytes, bytearray, memoryview)) else str(artifact)
    return model_from_decoded(read_artifact(read_artifact_bytes(artifact)), source)


def load_model(path: str | os.PathLike) -> nn.Module:
    """A checkpoint (dir or .safetensors) or artifact as the model it is: QAT re-applied at λ = 1."""
    from ..model import load_checkpoint
    from ..train.qat import QATSpec, apply_qat

    path = Path(path)
    if path.is_file() and path.suffix != ".safetensors":
        return model_from_artifact(path).eval()
    model = load_checkpoint(path)
    if model.config.qat:
        apply_qat(model, QATSpec.from_dict(model.config.qat))  # exported=True keeps weights
    return model.eval()


def load(source: str | os.PathLike | bytes, *, as_model: bool = False):
    """``recurnorm.load``: an artifact (bytes or a path) back as ``{name: Tensor}``, dequantized to
    the original dtypes (tied names each get theirs); with ``as_model`` the model its metadata's
    config describes, in eval mode. ArtifactError on a corrupt or hostile file."""
    if as_model:
        return model_from_artifact(source).eval()
    from ..budget.api import unpack

    return unpack(read_artifact_bytes(source))


def factory_model_from_checkpoint(factory, path: str | os.PathLike) -> nn.Module:
    """A --model-factory model (spec or callable) with a checkpoint's weights (dir,
    .safetensors, .pt/.pth/.bin)."""
    from ..model.factory import build_model, resolve

    state, config = load_checkpoint_state(path)
    return build_model(resolve(factory), config, state, str(path))


def factory_model_from_artifact(factory, artifact: str | os.PathLike | bytes) -> nn.Module:
    """A --model-factory model with an artifact's dequantized weights (config from its
    metadata, or None)."""
    from ..budget.api import read_artifact
    from ..model.factory import build_model, resolve
    from ..quant import dequantize_all

    source = "artifact" if isinstance(artifact, (bytes, bytearray, memoryview)) else str(artifact)
    art = read_artifact(read_artifact_bytes(artifact))
    config = art.metadata.get("config")
    return build_model(
        resolve(factory),
        config if isinstance(config, dict) else None,
        dequantize_all(art.qtensors),
        source,
        error=ArtifactError,
    )


def load_checkpoint_state(source: str | Path) -> tuple[dict, dict | None]:
    """(state_dict, config or None) from a .safetensors file, a .pt/.pth/.bin, or a checkpoint
    folder (checkpoint_files: one file, or the shards its index names)."""
    from ..io import check_input

    files = checkpoint_files(source)
    state: dict = {}
    for file, names in files.items():
        check_input(file, "checkpoint")  # a FIFO or device: refused before any library opens it
        part = _load_file(file)
        check_shard(file, part, names, state)
        state.update(part)
    return state, check_checkpoint(source, files, state)


def check_checkpoint(source, files: dict, state: dict) -> dict | None:
    """The config.json beside a checkpoint (None: none, or a .pt's folder, which may be
    anything's), once its tensors (or their meta) are checked as an artifact will hold them:
    some, not too many, of dtypes a format stores. Errors name its file or shards' folder."""
    first = next(iter(files))
    path = first if len(files) == 1 else Path(source)
    if not state:
        raise CheckpointError(f"{path}: holds no tensors")
    check_pack_limits(state, path)
    _check_dtypes(state, path)
    cfg = first.parent / "config.json"
    with_config = Path(source).is_dir() or first.suffix == ".safetensors"
    return _read_config(cfg) if with_config and cfg.exists() else None


# Where a checkpoint folder's tensors are: one file, or shards (files a Hugging Face
# checkpoint is split into) that an index names: {"weight_map": {tensor: file in the folder}}.
FOLDER_FILES = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def checkpoint_files(path: str | Path) -> dict[Path, set[str] | None]:
    """{file: the tensor names it must hold (a shard's, from the index), or None (any)} of a
    checkpoint: a file itself, or a folder's model.safetensors, pytorch_model.bin, or the
    shards its index names (in the index's order). CheckpointError naming what is missing."""
    path = Path(path)
    if not path.is_dir():
        if not path.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        return {path: None}
    for name in FOLDER_FILES:
        if (path / name).exists():
            return {path / name: None}
    for name in SHARD_INDEXES:
        if (path / name).exists():
            return _shards(path / name)
    raise CheckpointError(f"{path} has no {', '.join(FOLDER_FILES)} or index of shards ({', '.join(SHARD_INDEXES)})")


def _shards(index: Path) -> dict[Path, set[str]]:
    from ..io import read_input

    # (the names must fit an artifact's manifest: an index that cannot is refused unread)
    data = read_input(index, spec.MAX_MANIFEST_BYTES, "the checkpoint's index of shards", CheckpointError)
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=fmt.no_constant)
    except (RecursionError, ValueError) as exc:
        raise CheckpointError(f"{index}: not valid JSON: {exc}") from None
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f'{index}: expected a "weight_map" of tensor names to shard files')
    # (its names alone, before any shard is opened: each shard then holds exactly its names)
    check_pack_limits(weight_map, index)
    files: dict[Path, set[str]] = {}
    for name, file in weight_map.items():
        # a plain name in the folder: never a path elsewhere (the index is the checkpoint's, not ours)
        if not isinstance(file, str) or file in ("", ".", "..") or Path(file).name != file or "\\" in file:
            raise CheckpointError(f"{index}: tensor {name!r}: {file!r} is not a file name in {index.parent}")
        files.setdefault(index.parent / file, set()).add(name)
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{index}: its shard {file.name} is missing from {index.parent}")
    return files


def check_shard(file: Path, held, names: set[str] | None, earlier) -> None:
    """CheckpointError unless a file holds the tensors its index says (names; None: any) and
    none that an earlier file held (held, earlier: collections of names)."""
    held = set(held)
    again = next((n for n in held if n in earlier), None)
    if again is not None:
        raise CheckpointError(f"{file}: tensor {again!r} is in an earlier shard too")
    if names is not None and held != names:
        extra = sorted(held - names)
        why = (
            f"holds tensor {extra[0]!r}, which the index does not put in it"
            if extra
            else f"lacks tensor {min(names - held)!r}, which the index puts in it"
        )
        raise CheckpointError(f"{file}: {why}")


def _load_file(path: Path) -> dict:
    """The tensors of one .safetensors or .pt/.pth/.bin file."""
    import torch

    from ..io import open_input

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        _check_safetensors_header(path)
        try:
            return load_file(str(path))
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read safetensors: {exc}") from None
    if path.suffix not in (".pt", ".pth", ".bin"):
        raise CheckpointError(f"{path}: expected a directory, .safetensors, .pt, .pth or .bin")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's concern
            warnings.simplefilter("ignore")
            with open_input(path, "checkpoint") as f:
                obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if type(exc).__name__ != "UnpicklingError":  # torch's weights_only refusal
            raise CheckpointError(f"{path}: cannot load as a weights-only state dict: {first}") from None
        # torch's own text runs to several lines and suggests weights_only=False: never.
        raise CheckpointError(
            f"{path}: holds Python objects besides tensors; recurnorm never unpickles them "
            "(unpickling runs the file's code): save a plain state dict or .safetensors"
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a state dict")
    state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    _check_keys_and_layouts(state, path)
    return state


# A safetensors header's JSON is parsed whole by the library (Rust) before any tensor is
# read: 3M metadata keys in a 41 MB header took it 9-12 s and 690 MB. A checkpoint has ~4
# keys a tensor, so this allows 65K tensors; the colons are counted (strings may hold some:
# an over-count, never an under-count) before the library sees the file.
MAX_SAFETENSORS_KEYS = 1 << 18


def _check_safetensors_header(path: Path) -> None:
    """CheckpointError when the header is too large to hand to the safetensors library."""
    import struct

    from ..io import open_input

    try:
        with open_input(path, "checkpoint") as f:
            head = f.read(8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            if size > 100_000_000:  # the library's own limit: it says so itself
                return
            colons = f.read(size).count(b":")
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if colons > MAX_SAFETENSORS_KEYS:
        raise CheckpointError(
            f"{path}: the safetensors header holds over {MAX_SAFETENSORS_KEYS:,} keys "
            f"({colons:,}; ~4 a tensor, plus __metadata__'s): not read"
        )


def _read_config(cfg_path: Path) -> dict:
    """The checkpoint's config.json (it rides in the artifact's manifest, so it is bounded as
    the manifest is: size and nesting); CheckpointError naming the file."""
    from ..io import read_input

    # (an artifact's manifest, which carries it, holds at most MAX_MANIFEST_BYTES)
    data = read_input(cfg_path, spec.MAX_MANIFEST_BYTES, "the checkpoint's config", CheckpointError)
    try:
        config = json.loads(data.decode("utf-8"), parse_constant=fmt.no_constant)
    except RecursionError:
        raise CheckpointError(f"{cfg_path}: nests too deeply to read") from None
    except ValueError as exc:
        raise CheckpointError(f"{cfg_path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object of model settings, got {type(config).__name__}")
    if fmt.json_depth(config, spec.MAX_CONFIG_DEPTH) > spec.MAX_CONFIG_DEPTH:
        raise CheckpointError(
            f"{cfg_path}: nests more than {spec.MAX_CONFIG_DEPTH} levels deep (the artifact's manifest holds "
            f"{spec.MAX_JSON_DEPTH}, its own included)"
        )
    return config


# A manifest entry takes ~300-600 bytes (streams, hashes): 16,384 of them fill most of the
# 8 MiB a manifest may hold; refusing more from the count alone costs nothing.
MAX_PACK_TENSORS = 16_384
MIN_ENTRY_BYTES = 200  # a stored tensor's manifest entry without its name: at least this


def check_pack_limits(state: dict, path) -> None:
    """CheckpointError when the tensor count or names alone would overflow an artifact's
    manifest: checked from the names, before any tensor is read or quantized."""
    if len(state) > MAX_PACK_TENSORS:  # before any tensor is quantized (20,000 took 33 s and 1.6 GB)
        raise CheckpointError(
            f"{path}: {len(state):,} tensors; an artifact holds at most {MAX_PACK_TENSORS:,} (its manifest, "
            f"~300-600 bytes an entry, at most {spec.MAX_MANIFEST_BYTES:,} bytes)"
        )
    # Names alone can fill the manifest: every stored entry takes its name and ~270 bytes
    # more, and at least half the entries are stored (an alias per stored tensor at most).
    least = sum(len(json.dumps(name)) for name in state) + MIN_ENTRY_BYTES * len(state) // 2
    if least > spec.MAX_MANIFEST_BYTES:
        raise CheckpointError(
            f"{path}: its {len(state):,} tensor names would make a manifest of over {least:,} bytes; "
            f"an artifact's holds at most {spec.MAX_MANIFEST_BYTES:,}"
        )


def _check_keys_and_layouts(state: dict, path: Path) -> None:
    """CheckpointError naming the first key that is not a string, or the first tensor that is
    sparse, on the meta device or otherwise not a plain strided tensor (torch.load gives them)."""
    import torch

    from ..display import printable

    for key, t in state.items():
        if not isinstance(key, str):
            raise CheckpointError(
                f"{path}: key {printable(repr(key))[:80]} is of type {type(key).__name__}, not a string: "
                "tensor names are strings"
            )
        if t.layout != torch.strided:
            raise CheckpointError(f"{path}: tensor {key!r} is {str(t.layout).removeprefix('torch.')}: store it dense")
        if t.is_meta:
            raise CheckpointError(f"{path}: tensor {key!r} is on the meta device: it holds no values")


def _check_dtypes(state: dict, path: Path) -> None:
    """CheckpointError naming the first tensor of a dtype no format stores (float8, complex)."""
    from ..quant.registry import ITEMSIZE, dtype_name

    for name in sorted(state):
        dt = dtype_name(state[name].dtype)
        if dt not in ITEMSIZE:
            raise CheckpointError(
                f"{path}: tensor {name!r} has dtype {dt}, which recurnorm cannot "
                f"store (supported: {', '.join(sorted(ITEMSIZE))})"
            )
