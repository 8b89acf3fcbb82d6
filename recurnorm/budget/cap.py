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
    decodes the artifact (`recurnorm loader`; a file, or its byte count) shown apart.

    The one count of "artifact + code (+ loader) vs cap": pack, verify, inspect, plan,
    --fit and the over-cap hint all ask it (``artifact_room``, ``report``, ``check``)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    code_files: list[str | Path] = field(default_factory=list)
    loader: str | Path | int | None = None
    _counted: tuple[int, int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ConfigError(f"the byte cap must be a positive integer, got {self.max_bytes!r}")

    def _count(self) -> tuple[int, int]:
        """(code files' bytes, loader's bytes), read once."""
        if self._counted is None:
            if self.loader is None or isinstance(self.loader, int):
                loader = self.loader or 0
            else:
                loader = code_bytes([self.loader], self.max_bytes)
            self._counted = (code_bytes(self.code_files, self.max_bytes), loader)
        return self._counted

    def loader_bytes(self) -> int:
        """The loader's counted bytes (0 without one)."""
        return self._count()[1]

    def with_cap(self, max_bytes: int) -> Budget:
        """The same code counted against another cap (--fit BYTES under a larger --max-bytes)."""
        other = Budget(max_bytes, list(self.code_files), self.loader)
        other._counted = self._counted
        return other

    def code_total(self) -> int:
        """Bytes of the code files and the loader (ConfigError on a file that cannot count)."""
        return sum(self._count())

    def counts_code(self) -> bool:
        """True when code files or a loader are counted (else the CLI says that code counts)."""
        return bool(self.code_files) or self.loader is not None

    def artifact_room(self) -> int:
        """The bytes the artifact itself may take: the cap less the code and the loader."""
        return self.max_bytes - self.code_total()

    def report(self, artifact_bytes: int, tensors: list[dict] | None = None) -> dict:
        """The JSON-able count: artifact, code (loader included, and apart), total, headroom."""
        loader = self.loader_bytes()
        code = self.code_total()
        total = artifact_bytes + code
        return {
            "max_bytes": self.max_bytes,
            "artifact_bytes": artifact_bytes,
            "code_bytes": code,
            "loader_bytes": loader,
            "total_bytes": total,
            "headroom_bytes": self.max_bytes - total,
            "over_cap": total > self.max_bytes,
            "tensors": tensors or [],
        }

    def check(self, artifact_bytes: int, tensors: list[dict] | None = None) -> dict:
        """``report``; raises OverCapError(report) when over the cap."""
        report = self.report(artifact_bytes, tensors)
        total, code = report["total_bytes"], report["code_bytes"]
        if total > self.max_bytes:
            raise OverCapError(
                f"{total:,} bytes (artifact {artifact_bytes:,} + code {code:,}) exceed the cap of "
                f"{self.max_bytes:,}: {total - self.max_bytes:,} bytes missing",
                report,
            )
        return report
