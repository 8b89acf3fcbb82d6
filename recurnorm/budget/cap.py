"""The byte cap: artifact bytes plus the bytes of the code that ships with it."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, OverCapError
from ..io import python_text

DEFAULT_MAX_BYTES = 16_000_000  # decimal, as the challenge counts it


def code_bytes(paths: list[str | Path], limit: int | None = None) -> int:
    """Byte count of the code files (a directory counts its .py files), each of which must
    decode as Python reads it: UTF-8, or the encoding it declares (`recurnorm wrap` writes
    latin-1). Regular files only (`/dev/zero` or a FIFO would never end); a file over `limit` bytes
    (the cap: it cannot fit anyway) is counted by its size, not read."""
    total = 0
    for p in paths:
        p = Path(p)
        files = sorted(f for f in p.rglob("*.py") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            try:
                st = f.stat()
                if not stat.S_ISREG(st.st_mode):
                    raise ConfigError(f"code file {f} is not a regular file")
                if limit is not None and st.st_size > limit:
                    total += st.st_size
                    continue
                with open(f, "rb") as fh:
                    data = fh.read(st.st_size + 1)
                python_text(data)
                total += len(data)
            except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as exc:
                raise ConfigError(f"code file {f}: {exc}") from None
    return total


@dataclass
class Budget:
    """A cap in bytes and the code counted against it: code files, and the loader that
    decodes the artifact (`recurnorm loader`; a file, or its byte count) shown apart."""

    max_bytes: int = DEFAULT_MAX_BYTES
    code_files: list[str | Path] = field(default_factory=list)
    loader: str | Path | int | None = None

    def loader_bytes(self) -> int:
        """The loader's counted bytes (0 without one)."""
        if self.loader is None or isinstance(self.loader, int):
            return self.loader or 0
        return code_bytes([self.loader], self.max_bytes)

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ConfigError(f"the byte cap must be a positive integer, got {self.max_bytes!r}")

    def code_total(self) -> int:
        """Bytes of the code files and the loader (ConfigError on a file that cannot count)."""
        return code_bytes(self.code_files, self.max_bytes) + self.loader_bytes()

    def check(self, artifact_bytes: int, tensors: list[dict] | None = None) -> dict:
        """A JSON-able report; raises OverCapError(report) when over the cap.
        code_bytes counts the loader too; loader_bytes says how much of it that is."""
        loader = self.loader_bytes()
        code = code_bytes(self.code_files, self.max_bytes) + loader
        total = artifact_bytes + code
        report = {
            "max_bytes": self.max_bytes,
            "artifact_bytes": artifact_bytes,
            "code_bytes": code,
            "loader_bytes": loader,
            "total_bytes": total,
            "headroom_bytes": self.max_bytes - total,
            "over_cap": total > self.max_bytes,
            "tensors": tensors or [],
        }
        if total > self.max_bytes:
            raise OverCapError(
                f"{total:,} bytes (artifact {artifact_bytes:,} + code {code:,}) exceed the cap of "
                f"{self.max_bytes:,}: {total - self.max_bytes:,} bytes missing",
                report,
            )
        return report
