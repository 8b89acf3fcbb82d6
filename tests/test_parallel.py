"""--jobs: fn over items in worker processes (threads where there is no fork), in order, under
a cap on the sizes at work; errors, killed workers and Ctrl-C end as with one job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from recurnorm import parallel
from recurnorm.budget import api
from recurnorm.errors import QuantError
from recurnorm.quant import registry as quant
from recurnorm.quant.qtensor import QTensor

ROOT = Path(__file__).resolve().parent.parent


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _tagged(i):
    return [i, os.getpid()], [bytes([i % 256]) * i, b""]


def _slow_tagged(i):
    time.sleep(0.01)  # (the jobs take turns: one alone could take every item before the others start)
    return _tagged(i)


def test_jobs_run_in_worker_processes_and_come_back_in_order():
    got = list(parallel.ordered(_slow_tagged, list(range(40)), 3, [1] * 40, 10))
    assert [v[0] for v, _ in got] == list(range(40))
    assert [bytes(b[0]) for _, b in got] == [bytes([i % 256]) * i for i in range(40)]
    pids = {v[1] for v, _ in got}
    assert os.getpid() not in pids and 1 < len(pids) <= 3
    assert all(_gone(p) for p in pids)  # killed and reaped: none left behind


def test_jobs_go_on_with_the_processes_the_system_forks(monkeypatch):
    """A ulimit refuses the third fork: the items run on two workers; refused from the second,
    here, in order."""
    fork = os.fork
    for allowed in (2, 1):
        forks = []

        def limited(allowed=allowed, forks=forks):
            if len(forks) >= allowed:
                raise BlockingIOError(11, "Resource temporarily unavailable")
            forks.append(1)
            return fork()

        monkeypatch.setattr(os, "fork", limited)
        got = list(parallel.ordered(_slow_tagged, list(range(20)), 8, [1] * 20, 10))
        assert [v[0] for v, _ in got] == list(range(20))
        assert len({v[1] for v, _ in got}) == allowed and (os.getpid() in {v[1] for v, _ in got}) == (allowed < 2)


def _dies_in_a_worker(parent):
    def fn(i):
        if i == 3 and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)  # (as the kernel's out-of-memory killer does)
        time.sleep(0.1)  # (the other job is still at work when the death is seen)
        return [i, os.getpid()], []

    return fn


def _large(i):
    return [i], [np.full(8 << 20, i, np.uint8), b"", bytes([i]) * 3]


def _shmem_kb() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("RssShmem:")[1].split()[0])


@pytest.mark.skipif(not parallel.FORK, reason="worker processes are Linux's")
def test_a_workers_bytes_come_back_mapped_here_and_count_in_its_memory():
    """A result's bytes come back in a memory file this process maps (through a pipe they moved
    at 250 MB/s, the worker waiting): exact, read-only, and resident here as they arrive, so that
    they count in this process's memory as a copy would."""
    before = _shmem_kb()
    got = list(parallel.ordered(_large, [1, 2, 3], 2, [1] * 3, 10))
    assert _shmem_kb() - before >= 3 * (8 << 10)
    for i, (value, (big, empty, small)) in zip([1, 2, 3], got, strict=True):
        assert value == [i] and big.readonly and len(big) == 8 << 20
        assert np.frombuffer(big, np.uint8).min() == np.frombuffer(big, np.uint8).max() == i
        assert bytes(empty) == b"" and bytes(small) == bytes([i]) * 3


@pytest.mark.skipif(not parallel.FORK, reason="memory files are Linux's")
def test_a_memory_file_shorter_than_its_frame_says_is_a_dead_workers():
    fd = os.memfd_create("short")
    try:
        os.write(fd, b"x" * 10)
        assert bytes(parallel._mapped([fd], 10)) == b"x" * 10
        with pytest.raises(EOFError):  # (mapped past its end, reading it would kill this process)
            parallel._mapped([fd], 11)
    finally:
        os.close(fd)


def test_an_item_whose_worker_died_is_run_here():
    got = list(parallel.ordered(_dies_in_a_worker(os.getpid()), list(range(12)), 2, [1] * 12, 10))
    assert [v[0] for v, _ in got] == list(range(12))
    assert got[3][0][1] == os.getpid()
    # the jobs end with it: what was sent (4 at most) comes back, the rest run here
    assert all(v[1] == os.getpid() for v, _ in got[8:])


def _qtensors():
    rng = np.random.default_rng(0)
    q = quant.get("int8")
    qts = {f"w{i}": q.quantize(rng.standard_normal((64, 48)).astype(np.float32), name=f"w{i}") for i in range(6)}
    qts["tied"] = qts["w2"]
    return qts


def test_pack_codes_in_workers_with_the_same_bytes(monkeypatch, tmp_path):
    """The process path itself: each tensor coded in another process, the bytes of one job."""
    log = tmp_path / "pids"
    encode = api._encode_tensor

    def logged(name, *args):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return encode(name, *args)

    monkeypatch.setattr(api, "_encode_tensor", logged)
    one = api.pack_qtensors(_qtensors(), jobs=1)
    assert set(log.read_text().split()) == {str(os.getpid())}
    log.unlink()
    assert api.pack_qtensors(_qtensors(), jobs=2) == one
    pids = set(log.read_text().split())
    assert len(log.read_text().split()) == 6 and str(os.getpid()) not in pids
    manifest, rows = api.decoded_stats(one)
    assert api.decoded_stats(one, jobs=3) == (manifest, rows)  # the self-check's decode in jobs


def test_the_self_check_decodes_lqer_factors_with_their_tensor_in_jobs(tmp_path):
    import torch
    from safetensors.torch import save_file

    from recurnorm.export.pack import pack_checkpoint
    from recurnorm.export.spec import build_policy

    g = torch.Generator().manual_seed(0)
    save_file(
        {f"blocks.{i}.mlp.fc.weight": torch.randn(48, 32, generator=g) for i in range(3)}, tmp_path / "m.safetensors"
    )
    data = pack_checkpoint(tmp_path / "m.safetensors", build_policy("int6:lqer=2")).data
    rows = api.decoded_stats(data)
    assert api.decoded_stats(data, jobs=2) == rows
    assert any("lowrank_of" in r for r in rows[1])


def test_a_failing_tensor_raises_its_error_as_with_one_job():
    qts = _qtensors()
    qts["w4"] = QTensor("int8", (64, 48), "float32", np.zeros(64 * 48, np.int8), np.ones(64, np.float32))  # 1-D codes
    errors = []
    for jobs in (1, 2):
        with pytest.raises(QuantError, match="tensor w4") as exc:
            api.pack_qtensors(qts, jobs=jobs)
        errors.append(str(exc.value))
    assert errors[0] == errors[1]


CTRL_C = """
import os, sys, time
from recurnorm import parallel

def slow(i):
    os.write(1, f"{os.getpid()}\\n".encode())  # (one write: the two workers' lines never mix)
    time.sleep(120)
    return [i], []

try:
    list(parallel.ordered(slow, [0, 1, 2], 2, [1, 1, 1], 10))
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_ctrl_c_stops_and_reaps_the_workers():
    """SIGINT to the process group, as a terminal sends it: the parent exits 130, no worker left."""
    p = subprocess.Popen([sys.executable, "-c", CTRL_C], cwd=ROOT, stdout=subprocess.PIPE, start_new_session=True)
    try:
        pids = [int(p.stdout.readline()) for _ in range(2)]
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=60) == 130
    finally:
        p.kill()
    assert all(_gone(pid) for pid in pids)


def test_jobs_go_on_with_the_threads_the_system_gives(monkeypatch):
    """Without fork: a ulimit refuses a third live thread: the items run on two, in order;
    refused from the first, on the calling thread."""
    monkeypatch.setattr(parallel, "FORK", False)
    start = threading.Thread.start
    for allowed in (2, 0):
        started = []

        def limited(self, allowed=allowed, started=started):
            if sum(t.is_alive() for t in started) >= allowed:
                raise RuntimeError("can't start new thread")
            started.append(self)
            start(self)

        monkeypatch.setattr(threading.Thread, "start", limited)
        assert list(parallel.ordered(lambda i: i * i, list(range(20)), 8, [1] * 20, 10)) == [i * i for i in range(20)]
        assert len(started) == 2 * allowed  # the probe's threads, then the pool's


def test_jobs_never_hold_more_weights_at_once_than_the_largest_tensor(monkeypatch):
    """--jobs codes tensors side by side while their weights together stay within the largest
    tensor's and SIDE_BY_SIDE_WEIGHTS / 4 (or SIDE_BY_SIDE_WEIGHTS): two embedding-sized
    tensors, each ~10 bytes a weight at its peak, never run together, nor beside a small one;
    small ones do; results come in order (the scheduler is the same for threads and processes)."""
    monkeypatch.setattr(parallel, "FORK", False)
    monkeypatch.setattr(api, "SIDE_BY_SIDE_WEIGHTS", 10)
    sizes = [3, 3, 3, 100, 100, 3, 3, 3, 3]
    lock, running, together = threading.Lock(), [], threading.Barrier(3, timeout=30)

    def code(item):
        with lock:
            running.append(item)
            alone = list(running)
        if item < 3:
            together.wait()  # the first three run side by side (3 jobs, 9 weights <= 100), or this breaks
        with lock:
            running.remove(item)
        assert sizes[item] < 100 or alone == [item]
        return item

    assert list(parallel.ordered(code, list(range(len(sizes))), 3, sizes, api._limit(sizes))) == list(range(9))


def test_a_large_item_at_work_leaves_the_other_jobs_busy(monkeypatch):
    """The embedding and the head (large, first) do not run together, but the layers' matrices
    start beside each, out of order: item 0 ends only once item 2 has started."""
    monkeypatch.setattr(parallel, "FORK", False)
    sizes = [100, 100, 5, 5, 5, 5]
    second_started, order = threading.Event(), []

    def code(item):
        order.append(item)
        if item == 2:
            second_started.set()
        if item == 0:
            assert second_started.wait(timeout=30)
        return item

    assert list(parallel.ordered(code, list(range(6)), 2, sizes, 110)) == list(range(6))
    assert order.index(2) < order.index(1)


@pytest.mark.parametrize("jobs_as", ["processes", "threads", "threads, no pwrite"])
def test_verify_and_unpack_give_the_same_for_any_jobs(tmp_path, monkeypatch, jobs_as):
    """Tied names, an LQER tensor, an empty one: unpack writes the same file (each tensor written
    by the job that decoded it: positionally, or under a lock where the system has no pwrite),
    verify the same report."""
    import torch
    from click.testing import CliRunner
    from safetensors.torch import load_file, save_file

    from recurnorm.cli.main import main
    from recurnorm.export.pack import pack_checkpoint
    from recurnorm.export.spec import build_policy

    g = torch.Generator().manual_seed(0)
    sd = {f"blocks.{i}.mlp.fc.weight": torch.randn(48, 32, generator=g) for i in range(3)}
    save_file({**sd, "empty": torch.zeros(0, 4)}, tmp_path / "m.safetensors")
    arts = [tmp_path / "lqer.rnpk", tmp_path / "tied.rnpk"]
    arts[0].write_bytes(pack_checkpoint(tmp_path / "m.safetensors", build_policy("int6:lqer=2")).data)
    arts[1].write_bytes(api.pack_qtensors(_qtensors()))
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a], catch_exceptions=False)  # noqa: E731
    monkeypatch.setattr(parallel, "FORK", jobs_as == "processes")
    if jobs_as == "threads, no pwrite":
        monkeypatch.delattr(os, "pwrite")
    for art in arts:
        files, reports = [], []
        for jobs in (1, 2):
            out = tmp_path / f"{art.stem}-{jobs}.safetensors"
            assert run("unpack", art, "-o", out, "--jobs", jobs).exit_code == 0
            files.append(out.read_bytes())
            r = run("verify", art, "--json", "--jobs", jobs)
            assert r.exit_code == 0, r.output
            reports.append(r.output)
        assert files[0] == files[1] and reports[0] == reports[1]
        want = api.unpack(art.read_bytes())  # the library's state dict, in memory
        got = load_file(tmp_path / f"{art.stem}-2.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_corrupt_payload_is_reported_as_such_with_any_jobs(jobs):
    """With jobs, the payload's checksum is taken beside the decoding: a mismatch is still what
    verify reports, whether decoding the corrupt streams failed first or not at all."""
    from recurnorm.budget import format as fmt

    good = api.pack_qtensors(_qtensors())
    assert api.verify_bytes(good, jobs=jobs).ok
    manifest, payload = fmt.read_container(good)
    flipped = bytearray(good)
    flipped[48 + len(payload) - 5] ^= 0xFF  # in the last stream: its decoding fails on its own checksum
    wrong_sum = fmt.write_container(manifest, bytes(payload), (len(payload), "0" * 64))  # decodes fine
    for data in (bytes(flipped), wrong_sum):
        report = api.verify_bytes(data, jobs=jobs)
        assert not report.ok and "payload checksum mismatch" in report.reason


def test_items_start_out_of_order_only_while_the_results_waiting_hold_little(monkeypatch):
    """Results that came back before their turn hold memory: past HOLD_BYTES, nothing more
    starts out of order (here: item 2 waits for item 0, which waits for item 1's end)."""
    monkeypatch.setattr(parallel, "FORK", False)
    monkeypatch.setattr(parallel, "HOLD_BYTES", 5)
    first_done, events = threading.Event(), []

    def code(item):
        events.append(("start", item))
        if item == 0:
            assert first_done.wait(timeout=30)
        events.append(("end", item))
        if item == 1:
            first_done.set()
        return [item], [b"x" * 10]

    got = list(parallel.ordered(code, list(range(4)), 2, [100, 5, 5, 5], 105))  # (item 0 beside one more)
    assert [v for v, _ in got] == [[0], [1], [2], [3]]
    assert events.index(("start", 2)) > events.index(("end", 0))


def test_write_behind_writes_at_the_position_and_drops_what_it_wrote(monkeypatch, tmp_path):
    """WriteBehind.write is the file's write; every EVICT_BYTES it syncs and drops the ranges
    written since (posix_fadvise DONTNEED, in a thread), and flush() the rest and waits."""
    from recurnorm import io as rio

    monkeypatch.setattr(rio, "EVICT_BYTES", 10)
    dropped = []
    if hasattr(rio.os, "posix_fadvise"):
        monkeypatch.setattr(rio.os, "posix_fadvise", lambda fd, pos, n, how: dropped.append((pos, n)))
    with open(tmp_path / "f", "w+b") as f:
        f.write(b"head")
        behind = rio.WriteBehind(f)
        for part in (b"abcdef", b"ghijkl", b"mn"):
            behind.write(part)
        if behind.syncing is not None:  # (the sync's thread)
            behind.syncing.join()
        assert dropped in ([(4, 6), (10, 6)], [])  # (10 bytes reached after the second)
        behind.flush()
    assert (tmp_path / "f").read_bytes() == b"headabcdefghijklmn"
    assert dropped in ([(4, 6), (10, 6), (16, 2)], [])


def test_write_behind_writes_in_a_thread_at_most_queue_bytes_ahead(monkeypatch, tmp_path):
    """write() returns while its bytes wait for the writer thread, until QUEUE_BYTES wait; the
    file gets them in order; a write's error reaches the next write() or flush()."""
    from recurnorm import io as rio

    monkeypatch.setattr(rio, "QUEUE_BYTES", 4)
    release, written = threading.Event(), []

    class Slow:  # a file whose writes wait for release
        def tell(self):
            return sum(map(len, written))

        def write(self, data):
            assert release.wait(30)
            if bytes(data) == b"bad":
                raise OSError(28, "No space left on device")
            written.append(bytes(data))

        def flush(self):
            pass

        def fileno(self):
            raise OSError("not a real file")

    monkeypatch.delattr(rio.os, "posix_fadvise", raising=False)  # (nothing to drop)
    behind = rio.WriteBehind(Slow())
    behind.write(b"abc")  # queued: the thread waits in write
    second = threading.Thread(target=behind.write, args=(b"de",))
    second.start()
    second.join(0.3)
    assert second.is_alive() and written == []  # 3 + 2 bytes would be past QUEUE_BYTES: it waits
    release.set()
    second.join(30)
    behind.flush()
    assert written == [b"abc", b"de"]
    behind.write(b"bad")
    with pytest.raises(OSError, match="No space"):
        behind.flush()


def _threads(i):
    import torch

    return torch.get_num_threads(), []


@pytest.mark.parametrize("jobs, fork", [(1, True), (2, True), (2, False)])
def test_each_job_runs_torch_on_one_thread(monkeypatch, jobs, fork):
    """--jobs 1 is one core's work, the same as each of N jobs (processes, or threads where
    there is no fork): torch's own threads off while the items run, back after."""
    import torch

    monkeypatch.setattr(parallel, "FORK", fork)
    torch.set_num_threads(2)
    seen = list(parallel.ordered(_threads, list(range(6)), jobs, [1] * 6, 10))
    assert [n for n, _ in seen] == [1] * 6
    assert torch.get_num_threads() == 2


_LOG: list[Path] = []


def _logged(i):
    with _LOG[0].open("a") as f:
        f.write(f"{os.getpid()} {i}\n")
    return _tagged(i)


def test_a_worker_gives_back_its_free_memory_before_a_small_item_after_a_large_one(monkeypatch, tmp_path):
    """After an item larger than LARGE_SHARE of the limit, the worker returns the memory it freed
    before it takes a smaller item (else it keeps a large tensor's working set beside the other
    job's), and not before a large one, which reuses it (its pages faulted in again)."""
    log = tmp_path / "log"
    monkeypatch.setattr(parallel.heap, "give_back", lambda: log.open("a").write(f"{os.getpid()} trim\n"))
    monkeypatch.setattr(sys.modules[__name__], "_LOG", [log])
    sizes = [100, 100, 1, 1, 100, 1, 30]  # (large: over 25; none runs beside another item)
    got = list(parallel.ordered(_logged, list(range(len(sizes))), 2, sizes, 100))
    assert [v[0] for v, _ in got] == list(range(len(sizes)))
    seen: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        pid, what = line.split()
        seen.setdefault(pid, []).append(what)
    trims = 0
    for events in seen.values():
        want, after_large = [], False
        for item in (int(e) for e in events if e != "trim"):
            if after_large and sizes[item] <= 25:
                want.append("trim")
            want.append(str(item))
            after_large = sizes[item] > 25
        assert events == want
        trims += want.count("trim")
    assert trims >= 1


def test_jobs_done_while_the_caller_takes_a_result_start_their_next_item_first():
    """A job that finished while the caller was busy with earlier results is given its next
    item before the caller gets the next result (not only when a result is still missing)."""
    events = []

    class Pool:  # two jobs: item 0 ends first, then item 1 has ended by the next look
        finishing = [[(0, True, "r0")], [(1, True, "r1")]]

        def alive(self):
            return 2

        def start(self, i):
            events.append(f"start {i}")

        def finished(self, block):
            return self.finishing.pop(0) if self.finishing else []

    got = parallel._schedule(Pool(), None, list(range(8)), [1] * 8, 10)
    assert next(got) == "r0"
    # both jobs busy, each with its next item waiting, before "r0"
    assert events == [f"start {i}" for i in range(6)] and parallel.QUEUED == 1


def _timed(item):
    i, seconds = item
    started = time.monotonic()
    time.sleep(seconds)
    return [i, started, time.monotonic()], []


@pytest.mark.skipif(not parallel.FORK, reason="worker processes are Linux's")
def test_a_job_that_finishes_starts_the_item_waiting_for_it_while_this_process_is_busy():
    """Each job has its next item waiting: it starts it while the caller is busy with an earlier
    result (items 4 and 5 start while the caller sleeps on item 1's), not when the caller next
    asks for a result."""
    got, woke = [], None
    for value, _ in parallel.ordered(_timed, [(i, 0.2) for i in range(6)], 2, [1] * 6, 10):
        got.append(value)
        if value[0] == 1:
            time.sleep(1.0)
            woke = time.monotonic()
    assert [v[0] for v in got] == list(range(6))
    assert got[4][1] < woke and got[5][1] < woke


@pytest.mark.skipif(not parallel.FORK, reason="worker processes are Linux's")
def test_whichever_job_is_free_takes_the_next_item():
    """The items waiting are not any one job's: the short ones never wait behind item 0's long one."""
    items = [(0, 1.0)] + [(i, 0.1) for i in range(1, 8)]
    got = [v for v, _ in parallel.ordered(_timed, items, 2, [1] * 8, 10)]
    assert [v[0] for v in got] == list(range(8))
    assert all(v[1] < got[0][2] for v in got[1:6])


def test_the_order0_bound_is_of_narrow_words_only():
    """Pack's and verify's tables give the order-0 bound of int codes and 2-byte float words;
    fp32's 4-byte words (nearly each its own symbol) get none, and the totals' comparison with
    the bound leaves their bytes out."""
    import torch

    from recurnorm.cli import tables

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g)
    qts = {f: quant.get(f).quantize(w) for f in ("int8", "bf16", "fp32")}
    _, rows = api.decoded_stats(api.pack_qtensors(qts))
    got = {r["name"]: r for r in rows}
    assert got["int8"]["order0_bytes"] > 0 and got["bf16"]["order0_bytes"] > 0
    assert got["fp32"]["order0_bytes"] is None and got["fp32"]["overhead"] is None
    narrow = sum(got[n]["codes_bytes"] for n in ("int8", "bf16"))
    assert f"codes {narrow:,} bytes vs order-0 bound" in tables.totals_lines(rows)
