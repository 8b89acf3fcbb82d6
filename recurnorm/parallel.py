"""fn over items in N jobs, results in the items' order, under a cap on the sizes at work at once.

Jobs are forked processes on Linux: the coders' Python holds the interpreter, so threads
gained only 1.06-1.29x on two cores (docs/SCALE.md). A forked worker inherits fn and items (a
memory-mapped checkpoint or artifact, the policy): nothing is sent to it but an item's number,
through a pipe all workers read (whichever is free takes the next). fn(item) returns (a JSON-able
value, [bytes-like]), which is what comes back: the JSON through a socket, the bytes in a memory
file sent with it, which this process maps (never pickle). Elsewhere jobs are threads
of this process, which share everything and send nothing: Windows has no fork, and macOS's
system libraries (Accelerate's BLAS, the Objective-C runtime) are not safe in a forked child.

An item that fails in a worker (an error, or the worker killed) is run again here when its turn
comes: its error, with its traceback, reaches the caller as with one job (a killed worker ends
the jobs: the rest run here too); Ctrl-C (SIGINT, sent to
the whole process group) is this process's alone, and every worker is killed and reaped on any
way out. fn must be pure (running an item twice gives the same result).
"""

from __future__ import annotations

import contextlib
import io
import json
import mmap
import os
import select
import signal
import socket
import struct
import sys
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from . import heap

FORK = sys.platform.startswith("linux")  # (tests set it False to run the thread path)
# A result: ok, its item and the JSON's length (with the memory file of its bytes), then the JSON
# [value, [lengths]]
FRAME = struct.Struct("<BQQ")


# Results that came back before their turn wait here up to this many bytes (their buffers):
# meanwhile later items start out of order, so that a large item at work does not leave the
# other jobs idle. A 1.1B-weight model: its int8 head and embedding take 7.9 s of CPU each, in
# which the other job codes ~170M weights of int4 matrices (0.45 bytes a weight coded); bf16,
# 1.3 bytes a weight coded: at 128 MiB the other job sat idle while the embedding was coded
# behind the head (two-job pack 13.6-14.8 s; 12.6-12.9 s at 256 MiB, 12.2-12.9 s at 384-512).
HOLD_BYTES = 1 << 28

# Items sent to the jobs beyond one each, waiting for the first job free: a job that finishes
# starts the next at once, not once this process (hashing and writing earlier results) has taken
# its result and sent it another. A 1.1B-weight model's two-job bf16 pack: each job had waited
# ~0.5 s of its 7.5 s coding in 200 such round trips (~4 ms each; 6 ms after a norm's 2k weights).
QUEUED = 1

# A worker gives back the memory it freed after an item larger than this share of the sizes
# allowed at work at once, before it takes a smaller one: else it keeps a large tensor's working
# set while the other job takes the next large one (bf16 pack of a 1.1B-weight model, 2 jobs:
# peak PSS 1,710 MB, the head's 616 MB kept by one worker beside the embedding's 668 MB in the
# other; 1,090 MB with it).
LARGE_SHARE = 0.25


def ordered(fn, items: list, jobs: int, sizes: list[int], limit: int):
    """fn(item) of each item, in order, at most jobs at a time. An item starts beside others
    while the sizes at work stay within limit (alone, any size starts); items start out of
    order while the results waiting for their turn hold at most HOLD_BYTES. Use it in a
    `with contextlib.closing(...)` so that the workers stop when the caller stops reading."""
    jobs = min(jobs, len(items))
    with one_thread():  # (here too: one job, or jobs that are threads of this process)
        if jobs < 2:
            yield from map(fn, items)
            return
        large = {i for i, size in enumerate(sizes) if size > limit * LARGE_SHARE}
        pool = _Forks(fn, items, jobs, large) if FORK else _Threads(fn, items, jobs)
        try:  # (where the system gave one job or none: here, in order)
            yield from map(fn, items) if pool.alive() < 2 else _schedule(pool, fn, items, sizes, limit)
        finally:
            pool.stop()


@contextlib.contextmanager
def one_thread():
    """torch and BLAS on one thread, as in each forked job: one job is one core's work. torch's
    own threads made one job take 1.36 cores (int8 pack of a 1.1B-weight model: 106 s of CPU in
    78 s), so that --jobs 1 was not one core, nor the same work as each of N jobs; the search's
    small products ran 1.3-15x slower on two OpenBLAS threads whenever another process shared the
    cores. Entered by the caller's thread before any job starts, it also remakes torch's thread
    pool there first (in a process forked after torch ran, two job threads remaking it at once
    can get none: "Invalid thread pool!")."""
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else 1
    try:
        with threadpool_limits(1):
            if torch:
                torch.set_num_threads(1)
            yield
    finally:
        if torch:
            torch.set_num_threads(threads)


def _schedule(pool, fn, items: list, sizes: list[int], limit: int):
    todo = list(range(len(items)))  # not started, in order
    working: dict[int, int] = {}  # item -> size
    done: dict[int, tuple[bool, object]] = {}  # item -> (ok, result or its exception or None)
    held = 0  # bytes of the results in done

    def start(first: int) -> None:  # what may start beside the work at hand, first (the next due) first
        while len(working) < (1 + QUEUED) * pool.alive() and todo:
            at_work = sum(working.values())
            fits = (i for i in todo if at_work + sizes[i] <= limit and (i == first or held <= HOLD_BYTES))
            i = todo[0] if not working else next(fits, None)
            if i is None:
                break
            todo.remove(i)
            working[i] = sizes[i]
            pool.start(i)

    def collect(block: bool) -> None:  # the results of the jobs that are done (block: one at least)
        nonlocal held
        for i, ok, result in pool.finished(block):
            del working[i]
            done[i] = (ok, result)
            held += _nbytes(done[i])

    for first in range(len(items)):
        while first not in done and (working or todo) and pool.alive():
            start(first)
            collect(block=True)
        ok, result = done.pop(first, (False, None))  # (no worker left: run it here)
        held -= _nbytes((ok, result))
        todo = [i for i in todo if i != first]
        # Jobs done while the caller took earlier results (pack hashes and writes each) start
        # their next item before the caller takes this one: a 1.1B-weight checkpoint's first
        # 300 MB of results, written in 1.5 s, left both jobs idle that long.
        collect(block=False)
        start(first + 1)
        if ok:
            yield result
        elif isinstance(result, BaseException):
            raise result  # (a thread's: its own traceback)
        else:
            yield fn(items[first])  # a worker's failure: again here, where its error is the caller's


def _nbytes(outcome: tuple[bool, object]) -> int:
    """The bytes a result (value, [bytes-like]) holds in its buffers (0 for anything else)."""
    ok, result = outcome
    if not ok or not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[1], list):
        return 0
    return sum(memoryview(b).nbytes for b in result[1])


class _Forks:
    """Worker processes forked from this one, all taking item numbers from one pipe (whichever is
    free takes the next: none waits behind a long item while another job is free), each sending
    its results back through a socket of its own. A worker that dies (killed: out of memory?)
    ends the pool: the others finish what the pipe holds and stop, and what did not come back
    runs here in its turn."""

    def __init__(self, fn, items: list, jobs: int, large: set[int]) -> None:
        self.results: dict[socket.socket, int] = {}  # a live worker's socket -> its pid
        self.out: set[int] = set()  # items sent to the pipe, their results not yet here
        task_r, self.tasks = os.pipe()  # (self.tasks: None once closed)
        try:
            for _ in range(jobs):
                self._fork(fn, items, task_r, large)
        except OSError:  # (EAGAIN: a ulimit on processes) the jobs the system gives
            pass
        except BaseException:  # (Ctrl-C between two forks)
            self.stop()
            raise
        finally:
            os.close(task_r)  # (the workers' now)

    def _fork(self, fn, items, task_r: int, large) -> None:
        mine, theirs = socket.socketpair()
        try:
            with warnings.catch_warnings():  # (3.12+ warns of forking a process with threads: torch's
                warnings.simplefilter("ignore", DeprecationWarning)  # pool idles; the child uses none)
                pid = os.fork()
        except OSError:
            mine.close()
            theirs.close()
            raise
        if pid == 0:  # the worker: never returns (os._exit: no atexit, no flush of the parent's buffers)
            code = 1
            try:
                os.close(self.tasks)
                for s in [mine, *self.results]:
                    s.close()
                _serve(fn, items, task_r, theirs, large)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        self.results[mine] = pid

    def alive(self) -> int:
        return len(self.results)

    def start(self, item: int) -> None:
        self.out.add(item)
        os.write(self.tasks, item.to_bytes(8, "little"))  # (8 bytes: one write, one worker's read)

    def finished(self, block: bool) -> list[tuple[int, bool, object]]:
        """(item, ok, result) of what has come back (block: wait for one); an item whose worker
        died comes back not ok."""
        if not self.out:
            return []
        ready, _, _ = select.select(list(self.results), [], [], None if block else 0)
        got = []
        for s in ready:
            try:
                got.append(_receive(s))
            except EOFError:
                return got + self._drained()
            self.out.discard(got[-1][0])
        return got

    def _drained(self) -> list[tuple[int, bool, object]]:
        """A worker died: the others finish what the pipe holds and exit; what they sent back, and
        each item that did not come back, not ok."""
        self._close_tasks()
        got = []
        for s, pid in self.results.items():
            with contextlib.suppress(EOFError):
                while True:
                    got.append(_receive(s))
            s.close()
            os.waitpid(pid, 0)
        self.results = {}
        lost = self.out - {item for item, _, _ in got}
        self.out = set()
        return got + [(item, False, None) for item in sorted(lost)]

    def stop(self) -> None:
        """Kill and reap every worker (a worker between items has nothing to lose)."""
        self._close_tasks()
        for s, pid in self.results.items():
            s.close()
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self.results = {}

    def _close_tasks(self) -> None:  # (a worker reading the pipe then sees its end)
        if self.tasks is not None:
            os.close(self.tasks)
            self.tasks = None


def _serve(fn, items: list, task_r: int, result: socket.socket, large: set[int]) -> None:
    """A worker's loop: an item's number in, its frame out, until the task pipe closes. The memory
    a large item freed goes back to the system when a small item comes next: a large one reuses
    it (given back at once, a 1.1B-weight model's embedding after its head faulted in 147k pages
    again, 0.9 s of system time in a two-job bf16 pack)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the parent answers it
    tasks, kept = io.FileIO(task_r, "rb"), False  # kept: a large item's freed memory is still ours
    with one_thread():  # (for the worker's life: the jobs are the parallelism)
        while len(head := tasks.read(8)) == 8:
            item = int.from_bytes(head, "little")
            if kept and item not in large:
                heap.give_back()
            kept = item in large
            try:
                value, buffers = fn(items[item])
                lengths = [memoryview(b).nbytes for b in buffers]
                text = json.dumps([value, lengths]).encode()
            except BaseException:  # the parent runs it again, and raises its error
                buffers, text = [], b""
            _send(result, FRAME.pack(bool(text), item, len(text)), text, buffers)
            value = buffers = None  # (the result sent: its memory freed too)


def _send(result: socket.socket, frame: bytes, text: bytes, buffers: list) -> None:
    """A result: its frame with a memory file of its bytes (if any), then its JSON. A pipe moved
    them at 250 MB/s, the worker waiting for this process to copy them out: 2.9 s of two jobs'
    10.3 s coding a 1.1B-weight model's bf16 (1.4 GB of streams); written to a memory file, 85 MB
    take 0.04 s, and this process maps them, no copy."""
    fds = []
    try:
        if buffers:
            fds.append(os.memfd_create("recurnorm-result", os.MFD_CLOEXEC))
            for b in buffers:
                _write(fds[0], memoryview(b).cast("B"))
        socket.send_fds(result, [frame], fds)
        result.sendall(text)
    finally:
        for fd in fds:
            os.close(fd)


def _receive(result: socket.socket) -> tuple[int, bool, object]:
    """(item, ok, (value, [bytes-like]) or None) of a worker's next result; EOFError: it died."""
    fds: list[int] = []
    try:
        ok, item, n = FRAME.unpack(_recv(result, FRAME.size, fds))
        if not ok:
            return item, False, None
        value, lengths = json.loads(_recv(result, n, fds))
        data = _mapped(fds, sum(lengths))
    finally:
        for fd in fds:
            os.close(fd)
    buffers, at = [], 0
    for n in lengths:
        buffers.append(data[at : at + n])
        at += n
    return item, True, (value, buffers)


def _recv(result: socket.socket, n: int, fds: list[int]) -> bytes:
    """n bytes from a worker's socket; the memory file that comes with them goes into fds."""
    parts, got = [], 0
    while got < n:
        part, more, _, _ = socket.recv_fds(result, n - got, 1)
        fds += more
        if not part:
            raise EOFError
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _mapped(fds: list[int], n: int) -> memoryview:
    """n bytes of the memory file sent with a result, mapped here (its pages this process's from
    now on: MAP_POPULATE, so that they count in its memory as a copy would)."""
    if not n:
        return memoryview(b"")
    if len(fds) != 1 or os.fstat(fds[0]).st_size < n:
        raise EOFError  # (a worker that died while writing it)
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return memoryview(mmap.mmap(fds[0], n, flags=flags, prot=mmap.PROT_READ))


def _write(fd: int, data) -> None:
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data) :]


class _Threads:
    """Threads of this process (where there is no fork): as many as the system starts."""

    def __init__(self, fn, items: list, jobs: int) -> None:
        self.fn, self.items = fn, items
        self.size = _startable_threads(jobs)
        self.pool = ThreadPoolExecutor(max(self.size, 1))  # (starts its threads as work comes)
        self.futures: dict = {}

    def alive(self) -> int:
        return self.size

    def start(self, item: int) -> None:
        self.futures[self.pool.submit(self.fn, self.items[item])] = item

    def finished(self, block: bool) -> list[tuple[int, bool, object]]:
        done = wait(self.futures, None if block else 0, FIRST_COMPLETED).done if self.futures else ()
        out = []
        for f in done:
            item = self.futures.pop(f)
            out.append((item, False, f.exception()) if f.exception() else (item, True, f.result()))
        return out

    def stop(self) -> None:
        for f in self.futures:
            f.cancel()
        self.pool.shutdown()


def _startable_threads(n: int) -> int:
    """How many of n threads the system starts at once: a ulimit on address space or tasks
    refuses some ("can't start new thread"; 8 MB of stack each), on a many-core machine
    too. Each is held until the last has started, then let go."""
    hold, threads = threading.Event(), []
    try:
        for _ in range(n):
            threads.append(threading.Thread(target=hold.wait, daemon=True))
            threads[-1].start()
    except RuntimeError:
        threads.pop()
    finally:
        hold.set()
        for t in threads:
            t.join()
    return len(threads)
