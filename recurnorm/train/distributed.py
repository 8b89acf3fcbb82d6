"""Who this process is in a torchrun job, and the few collectives training needs.

recurnorm runs on PyTorch's own launcher: ``torchrun --nproc_per_node=N -m
recurnorm.train ...`` (or ``recurnorm train --nproc N``, which calls it) sets
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; ``context()`` reads them and
joins the process group (gloo on CPU, nccl on GPU). Without those variables it
returns a one-process context and touches nothing, so the training loop has a
single code path.

Failure handling: a rank that raises records ``{"rank", "error", "message",
"exit_code"}`` in ``$RECURNORM_ERROR_DIR/rank<r>.json`` when the launcher
set that folder (``recurnorm train --nproc`` does), prints one ``error: rank r
of N: ...`` line, and exits; torchrun then stops the other ranks and the
launcher names the rank and its error.

``resolve_device`` is the one place a device is chosen; ``device_of`` (model/run.py, below
every stage that runs a model) the one place it is read.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..model.run import device_of  # noqa: F401  (train's callers read it here)

ERROR_DIR_ENV = "RECURNORM_ERROR_DIR"
# Fault injection for the tests and for rehearsing a launch: "RANK:STEP" makes that
# rank raise just before that (1-based) optimizer step.
CRASH_ENV = "RECURNORM_TEST_CRASH"
# A collective that waits longer than this is a hung job, not a slow one.
TIMEOUT = timedelta(minutes=10)


class RankCrash(RuntimeError):
    """The fault injected by RECURNORM_TEST_CRASH."""


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job; rank 0 of 1 when not launched by torchrun."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Only the main rank writes files and logs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def device(self, requested: str = "auto") -> torch.device:
        """The device of this rank: cuda:<local_rank> on a GPU machine, else CPU."""
        dev = resolve_device(requested)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", self.local_rank if self.distributed else 0)
        return dev

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """values summed over ranks (float64 on CPU: the order of ranks does not matter)."""
        if not self.distributed:
            return values
        out = values.detach().clone()
        if dist.get_backend() == "nccl":
            out = out.to(torch.device("cuda", self.local_rank))
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(values.device)

    def mean(self, value: float) -> float:
        """A Python float averaged over ranks."""
        if not self.distributed:
            return value
        return float(self.sum(torch.tensor([value], dtype=torch.float64))[0]) / self.world_size


def resolve_device(requested: str = "auto") -> torch.device:
    """The device a ``--device`` value names; "auto" is cuda where a GPU is present, else cpu."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(requested)


def env_world() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the torchrun environment; (0, 1, 0) outside it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as exc:
        raise ConfigError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {exc}") from exc
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"bad torchrun environment: RANK={rank} WORLD_SIZE={world}")
    return rank, world, local


def context(device: str = "auto") -> DistContext:
    """This process's DistContext; joins the process group once when WORLD_SIZE > 1."""
    rank, world, local = env_world()
    ctx = DistContext(rank=rank, world_size=world, local_rank=local)
    if world > 1 and not dist.is_initialized():
        use_nccl = ctx.device(device).type == "cuda"
        if use_nccl:
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if use_nccl else "gloo", timeout=TIMEOUT)
    return ctx


def shutdown() -> None:
    """Leave the process group (a clean exit; torchrun waits for every rank)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End this process with code; a rank of a multi-process job skips interpreter finalization.

    gloo's worker threads drop their reference to a finished collective's work after the rank
    has moved on; when that is the last reference to a tensor Python also holds, the thread
    takes the GIL to release it. If the main thread is already finalizing the interpreter,
    Python ends that thread inside C++ code that cannot unwind, and the C++ runtime aborts the
    rank ("terminate called without an active exception", SIGABRT) after a run that
    succeeded; torchrun then reports the job as failed. Seen in 1 of 12-17 two-rank jobs
    here (torch 2.13, gloo; a core dump shows the abort in ``~AsyncAllreduceWork`` on a gloo
    thread), with or without ``destroy_process_group``. Everything a run writes is closed by
    then, so a rank ends with ``os._exit`` after flushing its output; one process exits as usual.
    """
    if env_world()[1] <= 1:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def maybe_crash(ctx: DistContext, step: int) -> None:
    """Raise RankCrash when RECURNORM_TEST_CRASH names this rank and step (1-based)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    rank, _, at = spec.partition(":")
    if int(rank) == ctx.rank and int(at or 1) == step:
        raise RankCrash(f"injected crash ({CRASH_ENV}={spec}) before step {step}")


def report_failure(exc: BaseException, exit_code: int) -> None:
    """One stderr line naming the rank, plus the JSON record for the launcher (if it asked)."""
    rank, world, _ = env_world()
    message = str(exc) or type(exc).__name__
    print(f"error: rank {rank} of {world}: {message}", file=sys.stderr, flush=True)
    folder = os.environ.get(ERROR_DIR_ENV)
    if folder:
        record = {
            "rank": rank,
            "world_size": world,
            "error": type(exc).__name__,
            "message": message,
            "exit_code": exit_code,
        }
        try:
            (Path(folder) / f"rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")
        except OSError:
            pass  # the stderr line above still names the failure


def first_failure(folder: str | os.PathLike) -> dict | None:
    """The earliest rank failure recorded in folder (by file time), or None."""
    records = []
    for path in Path(folder).glob("rank*.json"):
        try:
            records.append((path.stat().st_mtime, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return min(records, key=lambda r: (r[0], r[1].get("rank", 0)))[1] if records else None
