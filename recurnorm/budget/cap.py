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
    """A cap in bytes and the code files counted against it."""

    max_bytes: int = DEFAULT_MAX_BYTES
    code_files: list[str | Path] = field(default_factory=list)

    def check(self, artifact_bytes: int, tensors: list[dict] | None = None) -> dict:
        """A JSON-able report; raises OverCapError(report) when over the cap."""
        code = code_bytes(self.code_files)
        total = artifact_bytes + code
        report = {
            "max_bytes": self.max_bytes, "artifact_bytes": artifact_bytes, "code_bytes": code,
            "total_bytes": total, "headroom_bytes": self.max_bytes - total,
            "over_cap": total > self.max_bytes, "tensors": tensors or [],
        }
        if total > self.max_bytes:
            raise OverCapError(
                f"{total:,} bytes (artifact {artifact_bytes:,} + code {code:,}) exceed the cap of "
                f"{self.max_bytes:,}: {total - self.max_bytes:,} bytes missing",
                report,
            )
        return report
