"""Train independent (scheme, seed) models in parallel processes, one per GPU where there are GPUs.

``recurnorm roundtrip --jobs N`` calls ``train_parallel`` before its measuring
loop: every model it would otherwise train one after another is trained by a
pool of N spawned processes and saved as a checkpoint, which the loop then
loads. Each job is the very call the sequential path makes (same config, seed,
pair_init and hyper-parameters), so on CPU the weights are bit-identical; on a
machine with GPUs job i runs on GPU ``i % n_gpus``, and on CPU each process
gets ``cpu_count // N`` torch threads so the jobs do not fight over cores.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainJob:
    """One model to train: its key, config, seed and where its checkpoint goes."""

    scheme: str
    seed: int
    config: dict
    out: str
    steps: int | None = None  # training length (None: train_kw's)
    train_kw: dict | None = None  # this job's overrides of train_kw (e.g. its own tuned lr)


@dataclass(frozen=True)
class JobResult:
    scheme: str
    seed: int
    path: str
    elapsed_s: float
    device: str
    steps: int | None = None
    error: str | None = None  # set (and no checkpoint) when keep_going caught the job's failure


def failure_text(exc: BaseException) -> str:
    """How a failed training is reported: the error's type and first line."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def job_devices(n_jobs: int) -> list[str]:
    """The device of each job slot: the GPUs in turn, or the CPU."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i % gpus}" if gpus else "cpu" for i in range(n_jobs)]


_DEVICE = "cpu"  # this worker process's device, set once by _init_worker


def _init_worker(slots, threads: int) -> None:
    """Take one device slot for the life of this worker, so two workers never share a GPU."""
    import torch

    global _DEVICE
    _DEVICE = slots.get()
    torch.set_num_threads(threads)


def _run_job(job: TrainJob, data: Any, tokenizer: str | None, train_kw: dict) -> JobResult:
    """One job in a worker process (top level: spawn must import it)."""
    from ..model import ModelConfig, save_checkpoint
    from ..train.config import TrainConfig
    from ..train.data import as_corpus
    from ..train.loop import train

    device = _DEVICE
    corpus = as_corpus(data, tokenizer)
    t0 = time.perf_counter()
    kw = {**train_kw, **(job.train_kw or {})}
    if job.steps is not None:
        kw["steps"] = job.steps
    result = train(
        ModelConfig.from_dict(job.config), corpus, TrainConfig(**kw, seed=job.seed), progress=False, device=device
    )
    save_checkpoint(result.model, job.out, force=True)
    return JobResult(job.scheme, job.seed, job.out, time.perf_counter() - t0, device, job.steps)


def train_parallel(
    jobs: list[TrainJob],
    *,
    data: Any,
    tokenizer: str | None,
    train_kw: dict,
    n_jobs: int,
    on_done: Callable[[JobResult], None] | None = None,
    keep_going: bool = False,
) -> dict[tuple[str, int, int | None], JobResult]:
    """Run the jobs on n_jobs processes; {(scheme, seed, steps): JobResult}.

    A failing job raises, or with ``keep_going`` becomes a JobResult whose
    ``error`` says why (the other jobs still run), so a caller can report it.
    """
    if not jobs:
        return {}
    n = max(1, min(int(n_jobs), len(jobs)))
    devices = job_devices(n)
    threads = max(1, (os.cpu_count() or 1) // n)
    results: dict[tuple[str, int], JobResult] = {}
    ctx = mp.get_context("spawn")
    slots = ctx.SimpleQueue()
    for dev in devices:
        slots.put(dev)
    with ProcessPoolExecutor(
        max_workers=n, mp_context=ctx, initializer=_init_worker, initargs=(slots, threads)
    ) as pool:
        futures = {pool.submit(_run_job, job, data, tokenizer, train_kw): job for job in jobs}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                res = fut.result()  # re-raises the worker's error (a RecurnormError keeps its type)
            except BrokenProcessPool:
                raise  # the pool itself died (a worker killed, spawn failed): not this job's training
            except Exception as exc:
                if not keep_going:
                    raise
                res = JobResult(job.scheme, job.seed, job.out, 0.0, "", job.steps, error=failure_text(exc))
            results[(res.scheme, res.seed, res.steps)] = res
            if on_done is not None:
                on_done(res)
    return results
