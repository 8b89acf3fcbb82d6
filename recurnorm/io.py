"""Small file helpers shared by every stage: atomic writes, no-clobber checks.

The one place where outputs are written: every command's output follows the same
rules (an existing file is replaced only with --force, never one of the command's own
inputs), a write that fails is one WriteError naming the path, and temp files left by a
killed write (`.NAME.PID.<random>.tmp`, PID no longer running) are removed by the next write
to the same path.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from .errors import OutputExistsError, WriteError


def python_text(data: bytes) -> str:
    """A Python file's bytes as Python reads them: UTF-8, or the encoding it declares
    (`recurnorm wrap` writes latin-1). UnicodeDecodeError, SyntaxError or LookupError else."""
    import io
    import tokenize

    return data.decode(tokenize.detect_encoding(io.BytesIO(data).readline)[0])


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when both paths exist and name the same file (links and ./ spellings included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_writable(path: str | os.PathLike, force: bool = False, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse to overwrite an existing output (a file or a run's folder) unless force is set,
    or to write over one of `inputs` (the files the command reads) even with force."""
    path = Path(path)
    for src in inputs:
        if same_file(path, src):
            raise OutputExistsError(f"{path} is an input of this command; write the output elsewhere")
    if (path.exists() or path.is_symlink()) and not force:
        raise OutputExistsError(f"{path} exists; pass --force to overwrite it")
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or not a pid we can ask about): leave it
    return True


def clean_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove temp files of earlier writes to path whose writer is gone (killed mid-write)."""
    path = Path(path)
    removed = []
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix) : -len(".tmp")].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            try:
                os.unlink(path.parent / name)
                removed.append(path.parent / name)
            except OSError:
                pass
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write data to path via a temp file in the same folder, then rename.

    WriteError (one line naming the path) when the folder or file cannot be written."""
    return atomic_write_stream(path, lambda f: f.write(data))


def atomic_write_stream(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """atomic_write_bytes for output made piece by piece: write(f) fills the temp file."""
    path = Path(path)
    tmp = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WriteError(f"cannot write {path}: a parent of it is a file, not a folder") from None
        clean_stale_temps(path)
        # The writer's pid in the name: the next write can tell a killed write's leftovers.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        _discard(tmp)
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _discard(tmp)
        raise
    return path


def _discard(tmp: str | None) -> None:
    if tmp is not None and os.path.exists(tmp):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def append_text(path: str | os.PathLike, text: str) -> Path:
    """Append UTF-8 text (a log or job summary: earlier text stays); WriteError naming the path."""
    path = Path(path)
    try:
        if str(path) != os.devnull and not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise WriteError(f"cannot append to {path}: {exc.strerror or exc}") from None
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
