"""Start a multi-process training job through torchrun and turn a rank's failure into one error.

``recurnorm train --nproc N`` calls ``launch(args, N)``: the very same
arguments run under ``python -m torch.distributed.run --standalone
--nproc_per_node=N -m recurnorm.train``. Each failing rank records its error
(recurnorm.train.distributed.report_failure) in a temporary folder; the first
one recorded is raised here as the library error it was, prefixed by its rank,
so the command exits with that error's code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from .. import errors
from .distributed import ERROR_DIR_ENV, first_failure

MODULE = "recurnorm.train"


def torchrun_command(nproc: int, args: list[str], module: str = MODULE) -> list[str]:
    """The torchrun command line that runs ``python -m module args`` on nproc local ranks."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={int(nproc)}",
        "-m",
        module,
        *args,
    ]


def launch(args: list[str], nproc: int, *, env: dict[str, str] | None = None) -> None:
    """Run the training job on nproc ranks; return on success, raise the first rank's error."""
    if nproc < 1:
        raise errors.ConfigError(f"--nproc must be >= 1, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="recurnorm-ranks-") as folder:
        run_env = {**os.environ, **(env or {}), ERROR_DIR_ENV: folder}
        proc = subprocess.run(torchrun_command(nproc, args), env=run_env, check=False)
        if proc.returncode == 0:
            return
        failure = first_failure(folder)
    if failure is None:
        raise errors.RecurnormError(
            f"torchrun exited with status {proc.returncode} before any rank reported an error (see its output above)"
        )
    kind = getattr(errors, str(failure.get("error")), None)
    message = f"rank {failure['rank']} of {failure['world_size']}: {failure['message']}"
    if isinstance(kind, type) and issubclass(kind, errors.RecurnormError):
        raise kind(message)
    raise errors.RecurnormError(f"{message} ({failure.get('error')}); training stopped on every rank")
