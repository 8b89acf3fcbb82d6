"""Small file helpers shared by every stage: atomic writes, no-clobber checks."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .errors import OutputExistsError


def check_writable(path: str | os.PathLike, force: bool = False) -> Path:
    """Refuse to overwrite an existing output unless force is set."""
    path = Path(path)
    if path.exists() and not force:
        raise OutputExistsError(f"{path} exists; pass --force to overwrite it")
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write data to path via a temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 text atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: object) -> Path:
    """Write JSON (indented, sorted keys, trailing newline) atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
