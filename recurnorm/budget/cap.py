"""The byte cap: artifact bytes plus the UTF-8 bytes of the code that ships with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, OverCapError

DEFAULT_MAX_BYTES = 16_000_000  # decimal, as the challenge counts it


def code_bytes(paths: list[str | Path]) -> int:
    """UTF-8 byte count of the code files (a directory counts its .py files)."""
    total = 0
    for p in paths:
        p = Path(p)
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            try:
                total += len(f.read_text(encoding="utf-8").encode("utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
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
        return code_bytes([self.loader])

    def check(self, artifact_bytes: int, tensors: list[dict] | None = None) -> dict:
        """A JSON-able report; raises OverCapError(report) when over the cap.
        code_bytes counts the loader too; loader_bytes says how much of it that is."""
        loader = self.loader_bytes()
        code = code_bytes(self.code_files) + loader
        total = artifact_bytes + code
        report = {
            "max_bytes": self.max_bytes, "artifact_bytes": artifact_bytes, "code_bytes": code,
            "loader_bytes": loader, "total_bytes": total, "headroom_bytes": self.max_bytes - total,
            "over_cap": total > self.max_bytes, "tensors": tensors or [],
        }
        if total > self.max_bytes:
            raise OverCapError(
                f"{total:,} bytes (artifact {artifact_bytes:,} + code {code:,}) exceed the cap of "
                f"{self.max_bytes:,}: {total - self.max_bytes:,} bytes missing",
                report,
            )
        return report
