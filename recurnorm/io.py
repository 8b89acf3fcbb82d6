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

import collections
import json
import os
import re
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError, OutputExistsError, WriteError


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_input(path: str | os.PathLike, what: str = "", error: type[Exception] = ConfigError) -> BinaryIO:
    """A file the tool reads, opened once: regular files only. Opened non-blocking so that a
    FIFO without a writer is refused at once instead of hanging; /dev/zero or /dev/urandom
    would never end. A special file is a usage error (ConfigError, exit 2, naming the path);
    `error` is raised when the file cannot be opened."""
    label = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot read {label}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{label} is {_kind(mode)}: only regular files are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | os.PathLike, limit: int, what: str = "", error: type[Exception] = ConfigError) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (counted as read, not from st_size,
    which a file growing under us or a special file gets wrong); `error` otherwise."""
    label = f"{what} {path}" if what else str(path)
    with open_input(path, what, error) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            # read(n) allocates n bytes up front: ask for the size, then one byte past the limit at most
            data = f.read(min(size, limit) + 1)
            if len(data) <= limit:
                data += f.read(limit + 1 - len(data))
        except OSError as exc:
            raise error(f"cannot read {label}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(f"{label}: more than {limit:,} bytes, the most it may hold")
    return data


def check_input(path: str | os.PathLike, what: str = "", error: type[Exception] = ConfigError) -> None:
    """Refuse a special file (FIFO, device, socket) before a library opens the path itself."""
    open_input(path, what, error).close()


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


def check_writable(
    path: str | os.PathLike, force: bool = False, inputs: Iterable[str | os.PathLike] = (), folder: bool = False
) -> Path:
    """Refuse to overwrite an existing output (a file, or with folder=True a run's folder)
    unless force is set, or to write over one of `inputs` (the files the command reads) even
    with force, or anything check_replaceable refuses."""
    path = Path(path)
    if not str(path):
        raise ConfigError("an empty output path: name a file")
    for src in inputs:
        if same_file(path, src):
            raise OutputExistsError(f"{path} is an input of this command; write the output elsewhere")
    check_replaceable(path, folder)
    if (path.exists() or path.is_symlink()) and not force:
        raise OutputExistsError(f"{path} exists; pass --force to overwrite it")
    return path


def check_appendable(path: str | os.PathLike) -> None:
    """OutputExistsError when a file appended to (a job summary) is not a regular file or
    os.devnull: a FIFO would block, a device or folder is no summary."""
    if not same_file(path, os.devnull):
        check_replaceable(path)


def check_replaceable(path: str | os.PathLike, folder: bool = False) -> None:
    """OutputExistsError (a usage error) when path is something --force must never replace:
    a directory (unless the output is a folder), a device node (as root, `-o /dev/null
    --force` would delete the system's), a FIFO or socket, or a symlink to one (`--report
    /dev/stdout`). A regular file, a link to one, a dangling link or nothing at all may be."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there (or no way to look: the write says why)
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return  # a dangling link: replacing it loses nothing
    if not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        want = "folders" if folder else "regular files"
        raise OutputExistsError(
            f"{path} is {_kind(mode) if not stat.S_ISREG(mode) else 'a file'}: outputs replace {want} only"
        )


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
    return atomic_write_many([(path, write)], exclusive=exclusive)[0]


def atomic_write_many(
    parts: list[tuple[str | os.PathLike, Callable[[BinaryIO], object]]], *, exclusive: bool = False
) -> list[Path]:
    """Several files that belong together (unpack's weights and config.json): every part is
    written to its temp file first, and only when all are complete are they renamed, so a part
    that fails (a full disk, a folder where a file goes) leaves every old file as it was."""
    done: list[tuple[Path, str]] = []
    path = None
    try:
        for path, write in parts:
            path = Path(path)
            done.append((path, _write_temp(path, write)))
        for path, _ in done:
            check_replaceable(path)  # again as the files are published: not a node that appeared since
        while done:
            path, tmp = done[0]
            if exclusive:
                _publish_exclusive(tmp, path)
            else:
                os.replace(tmp, path)
            done.pop(0)
    except OutputExistsError:  # (a FileExistsError: said as it is)
        raise
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        for _, tmp in done:
            _discard(tmp)
    return [Path(p) for p, _ in parts]


def _write_temp(path: Path, write: Callable[[BinaryIO], object]) -> str:
    """A finished temp file beside path (its name: marker, pid and token, so that the next
    write can tell a killed write's leftovers, and nothing else)."""
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb+") as f:  # wb+: a streamed writer may read back what it placed
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def temp_beside(path: str | os.PathLike) -> tuple[int, str]:
    """(fd, name) of a new temp file in path's folder (made if missing), for publish(): its
    name (marker, pid and token) lets the next write tell a killed write's leftovers."""
    path = Path(path)
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WriteError(f"cannot write {path}: a parent of it is a file, not a folder") from None
        clean_stale_temps(path)
        return tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None


def publish(tmp: str, path: str | os.PathLike, *, exclusive: bool = False) -> Path:
    """Give a finished temp file (temp_beside's, filled by a streamed pack) its name: synced, with
    the mode a plain open() gives; removed on failure. exclusive: never replace an existing file."""
    path = Path(path)
    try:
        check_replaceable(path)  # as the file is published: not a node that appeared since
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        if exclusive:
            _publish_exclusive(tmp, path)
        else:
            os.replace(tmp, path)
    except OutputExistsError:  # (a FileExistsError: said as it is)
        _discard(tmp)
        raise
    except OSError as exc:
        _discard(tmp)
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _discard(tmp)
        raise
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


_WRITE_CHUNK = 64 << 20  # bytes per write: a large buffer is never copied whole
_SEEK_LOCK = threading.Lock()  # (write_at where there is no pwrite: threads share one file position)


class WriteBehind:
    """A large output's ranges, once written, sent to disk and dropped from the page cache every
    EVICT_BYTES, so that its later pages reuse those instead of new ones. On the virtual machines
    we measure on, a page cache that grows writes at 74-90 MB/s (1 GiB: 11.8-14.5 s) and one that
    reuses its pages at 1.6 GB/s (fdatasync and drop every 16 MiB: 0.67 s); on any machine, a
    checkpoint-sized output does not push what else is cached out. Where there is no
    posix_fadvise (Windows, macOS), nothing is dropped. Forked jobs each keep their own ranges.
    The sync runs in a thread of its own, one at a time, while the writer goes on (pack's parent
    waited 1.45 s in fdatasync with two jobs); so do write()'s writes, at most QUEUE_BYTES ahead
    (pack's parent takes the next job's result meanwhile). flush() before the file is closed."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.ranges, self.pending, self.syncing = f, [], 0, None
        self.queue: collections.deque = collections.deque()  # what write() was given, not yet written
        self.queued, self.writer, self.error = 0, None, None
        self.changed = threading.Condition()

    def write(self, data) -> None:
        """f.write(data), at f's position after the earlier writes, by a thread of its own: data
        must not change until it is written (flush() waits for that)."""
        n = memoryview(data).nbytes
        with self.changed:
            while self.queued and self.queued + n > QUEUE_BYTES and self.error is None:
                self.changed.wait()
            if self.error is not None:
                raise self.error
            self.queue.append(data)
            self.queued += n
            self.changed.notify_all()
        if self.writer is None:
            self.writer = threading.Thread(target=self._write_queue, daemon=True)
            self.writer.start()

    def _write_queue(self) -> None:
        while True:
            with self.changed:
                while not self.queue:
                    self.changed.wait()
                data = self.queue[0]
                if data is None:  # (flush's)
                    self.queue.popleft()
                    return
            try:
                pos = self.f.tell()
                self.f.write(data)
                self.done(pos, memoryview(data).nbytes)
            except BaseException as exc:  # (ENOSPC...) raised by the next write() or flush()
                with self.changed:
                    self.error = exc
                    self.changed.notify_all()
                return
            with self.changed:
                self.queue.popleft()
                self.queued -= memoryview(data).nbytes
                self.changed.notify_all()

    def done(self, pos: int, n: int) -> None:
        """[pos, pos + n) holds what it will hold (or was read and is not needed again)."""
        self.ranges.append((pos, n))
        self.pending += n
        if self.pending >= EVICT_BYTES:
            self._evict()

    def flush(self) -> None:
        """Write what write() was given, evict what is left, and wait until it is."""
        if self.writer is not None:
            with self.changed:
                self.queue.append(None)
                self.changed.notify_all()
            self.writer.join()
            self.writer = None
            if self.error is not None:
                raise self.error
        self._evict()
        if self.syncing is not None:
            self.syncing.join()

    def _evict(self) -> None:
        ranges, self.ranges, self.pending = self.ranges, [], 0
        if self.syncing is not None:
            self.syncing.join()
        if not ranges or not hasattr(os, "posix_fadvise"):
            return
        self.f.flush()
        self.syncing = threading.Thread(target=_drop, args=(self.f.fileno(), ranges), daemon=True)
        self.syncing.start()


def _drop(fd: int, ranges: list[tuple[int, int]]) -> None:
    try:
        os.fdatasync(fd)
        for pos, n in ranges:
            os.posix_fadvise(fd, pos, n, os.POSIX_FADV_DONTNEED)
    except OSError:  # (a hint: the file closed under it by an error on the writer's side)
        pass


EVICT_BYTES = 64 << 20
QUEUE_BYTES = 64 << 20


def write_at(f: BinaryIO, pos: int, data) -> None:
    """data at pos in f, whose buffer holds nothing unwritten: positional (os.pwrite), so that
    jobs write side by side, forked ones too (they share the descriptor, not the file object)."""
    view = memoryview(data).cast("B")
    try:
        fd = f.fileno() if hasattr(os, "pwrite") else None
    except (OSError, ValueError):  # (io.UnsupportedOperation: a file in memory)
        fd = None
    if fd is None:  # (or Windows: its jobs are threads of this process)
        with _SEEK_LOCK:
            f.seek(pos)
            for i in range(0, len(view), _WRITE_CHUNK):
                f.write(view[i : i + _WRITE_CHUNK])
            f.flush()
        return
    while view:
        n = os.pwrite(fd, view[:_WRITE_CHUNK], pos)
        view, pos = view[n:], pos + n
