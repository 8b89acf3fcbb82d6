"""One rank of a torchrun test job: `python -m recurnorm.train ARGS`, with its writes audited.

Usage (from tests/test_distributed.py):
    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/dist_worker.py \
        AUDIT_DIR WATCH_DIR -- recurnorm train options...

An audit hook (sys.addaudithook) records every file this rank opens for writing,
creates, renames or removes under WATCH_DIR; at exit the list goes to
AUDIT_DIR/rank<r>.json, so the test can check that only rank 0 wrote.
"""

from __future__ import annotations

import json
import os
import sys

audit_dir, watch = sys.argv[1], os.path.realpath(sys.argv[2])
args = sys.argv[sys.argv.index("--") + 1 :]
writes: list[str] = []
WRITE_EVENTS = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.unlink", "os.rmdir"}


def _under_watch(path) -> bool:
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(watch)
    except (TypeError, ValueError):
        return False


def hook(event: str, hook_args: tuple) -> None:
    if event == "open" and hook_args and isinstance(hook_args[0], (str, bytes, os.PathLike)):
        mode = hook_args[1] if len(hook_args) > 1 else "r"
        flags = hook_args[2] if len(hook_args) > 2 else 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        if writing and _under_watch(hook_args[0]):
            writes.append(f"open {os.fsdecode(hook_args[0])}")
    elif event in WRITE_EVENTS and hook_args and _under_watch(hook_args[0]):
        writes.append(f"{event} {os.fsdecode(hook_args[0])}")


sys.addaudithook(hook)

from recurnorm.train.__main__ import main  # noqa: E402
from recurnorm.train.distributed import exit_process  # noqa: E402

code = main(args)
rank = os.environ.get("RANK", "0")
with open(os.path.join(audit_dir, f"rank{rank}.json"), "w") as f:
    json.dump(writes, f)
exit_process(code)  # as python -m recurnorm.train ends a rank
