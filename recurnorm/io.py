"""Small file helpers shared by every stage: atomic writes, no-clobber checks.

The one place where outputs are written: every command's output follows the same
rules (an existing file is replaced only with --force, never one of the command's own
inputs, never another output of the same command), a write that fails is one WriteError
naming the path, and no-clobber holds at the moment the file appears, not only when the
command starts: `exclusive=True` publishes the finished temp file with os.link, which fails
when the path exists, so of several writers started together exactly one wins. Temp files
carry this tool's marker, the writer's PID and a random token
(`.NAME.recurnorm-tmp-PID-<8 random>.tmp`); one whose PID no longer runs (a killed write) is
removed by the next write to the same path, and no other file ever is.
"""

from __future__ import annotations

import json
import os
import re
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


def check_distinct(outputs: dict[str, str | os.PathLike | None]) -> None:
    """ConfigError (a usage error) when two of a command's outputs ({what: path}) are one file:
    the second write would replace the first."""
    from .errors import ConfigError

    seen: dict[str, str] = {}
    for what, path in outputs.items():
        if path is None:
            continue
        key = os.path.normcase(os.path.abspath(path))
        for other, other_key in seen.items():
            if key == other_key or same_file(path, outputs[other]):
                raise ConfigError(f"{other} and {what} both name {path}: give each its own file")
        seen[what] = key


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


TEMP_MARKER = "recurnorm-tmp"
_TOKEN = "[a-z0-9_]{8}"  # tempfile.mkstemp's random part


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{TEMP_MARKER}-{os.getpid()}-"


def clean_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove temp files of earlier writes to path whose writer is gone (killed mid-write):
    only names this module makes (marker, PID, token), never a user's file that looks alike."""
    path = Path(path)
    removed = []
    pattern = re.compile(re.escape(f".{path.name}.{TEMP_MARKER}-") + rf"(\d{{1,10}})-{_TOKEN}\.tmp")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if m is None:
            continue
        pid = m.group(1)
        if int(pid) != os.getpid() and not _pid_alive(int(pid)):
            try:
                os.unlink(path.parent / name)
                removed.append(path.parent / name)
            except OSError:
                pass
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, exclusive: bool = False) -> Path:
    """Write data to path via a temp file in the same folder, then rename.

    exclusive: never replace an existing file (OutputExistsError), checked as the file
    appears (callers pass `exclusive=not force`). WriteError (one line naming the path)
    when the folder or file cannot be written."""
    return atomic_write_stream(path, lambda f: f.write(data), exclusive=exclusive)


def atomic_write_stream(
    path: str | os.PathLike, write: Callable[[BinaryIO], object], *, exclusive: bool = False
) -> Path:
    """atomic_write_bytes for output made piece by piece: write(f) fills the temp file."""
    path = Path(path)
    tmp = None
    try:
        fd, tmp = temp_beside(path)
        try:
            with os.fdopen(fd, "wb+") as f:
                write(f)
        except OSError as exc:
            raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
        publish(tmp, path, exclusive=exclusive)
    except BaseException:
        _discard(tmp)
        raise
    return path


def temp_beside(path: str | os.PathLike) -> tuple[int, str]:
    """(fd, name) of a new temp file in path's folder (made if missing), for publish()."""
    path = Path(path)
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WriteError(f"cannot write {path}: a parent of it is a file, not a folder") from None
        clean_stale_temps(path)
        # Marker, pid and token in the name: the next write can tell a killed write's
        # leftovers, and nothing else.
        return tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None


def publish(tmp: str, path: str | os.PathLike, *, exclusive: bool = False) -> Path:
    """Give a finished temp file (temp_beside's) its name: synced, with the mode a plain open()
    gives; removed on failure. exclusive: never replace an existing file (OutputExistsError)."""
    path = Path(path)
    try:
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        if exclusive:
            _publish_exclusive(tmp, path)
        else:
            os.replace(tmp, path)
    except OutputExistsError:
        _discard(tmp)
        raise
    except OSError as exc:
        _discard(tmp)
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _publish_exclusive(tmp: str, path: Path) -> None:
    """Give the finished temp file its name unless the name exists, in one step: a hard link
    fails on an existing name (os.replace would not). Where the filesystem has no hard links,
    the name is claimed with O_EXCL (empty until the rename fills it)."""
    exists = OutputExistsError(f"{path} exists; pass --force to overwrite it")
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise exists from None
    except OSError:  # no hard links here (FAT, some network filesystems)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            raise exists from None
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


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


def atomic_write_text(path: str | os.PathLike, text: str, *, exclusive: bool = False) -> Path:
    """Write UTF-8 text atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"), exclusive=exclusive)


def atomic_write_json(path: str | os.PathLike, obj: object, *, exclusive: bool = False) -> Path:
    """Write JSON (indented, sorted keys, trailing newline) atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", exclusive=exclusive)
