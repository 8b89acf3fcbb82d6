"""The .rnpk container: a 48-byte header (magic, version, flags, the stored manifest's length
and SHA-256), the streams (the payload), then the manifest (canonical JSON, stored compressed
as the flags say, holding the payload's length and SHA-256); versions 1 and 2 put the manifest
before the payload. docs/FORMAT.md is the normative description. Reading parses JSON and
numbers only.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from typing import Any

from ..errors import ArtifactError, QuantError
from . import compress, spec


def dumps(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no spaces, UTF-8, so packing is deterministic."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def write_container(manifest: dict, payload: bytes | list[bytes], length_sha: tuple[int, str] | None = None) -> bytes:
    """Header + payload (or its parts: joined once) + manifest (with payload length and hash
    filled in, in its shortest portable form: raw, deflate or lzma). length_sha: the payload's,
    when given: its parts are then written elsewhere already, and header + manifest come back
    (the header's HEADER_SIZE bytes go before the payload, the manifest after it)."""
    parts = payload if isinstance(payload, list) else [payload]
    if length_sha is None:
        length_sha = (sum(map(len, parts)), hashlib.sha256(b"".join(parts)).hexdigest())
    manifest = {**manifest, "payload_length": length_sha[0], "payload_sha256": length_sha[1]}
    raw = dumps(manifest)
    _check_writable(manifest, raw)
    m, flags = compress.smallest(raw)
    flags |= sum(bit for field, bit in spec.FIELD_FLAGS.items() if has_field(manifest, field))
    return container(m, parts, flags)


def container(stored: bytes, payload: bytes | list[bytes], flags: int = 0, version: int = spec.VERSION) -> bytes:
    """An artifact's bytes from its stored manifest and payload, laid out as the version lays
    them out (tests forge artifacts of every version with it)."""
    header = spec.HEADER.pack(spec.MAGIC, version, flags, len(stored), hashlib.sha256(stored).digest())
    parts = payload if isinstance(payload, list) else [payload]
    return b"".join([header, *parts, stored] if version >= 3 else [header, stored, *parts])


def spans(data, version: int, mlen: int) -> tuple[memoryview, memoryview]:
    """(the stored manifest, the payload) of an artifact whose header says version and mlen (at
    most the bytes past the header): the manifest is its last mlen bytes (version 3), or the
    first past the header; the payload is the rest past the header."""
    data = memoryview(data)
    if version >= 3:
        at = len(data) - mlen
        return data[at:], data[spec.HEADER_SIZE : at]
    return data[spec.HEADER_SIZE : spec.HEADER_SIZE + mlen], data[spec.HEADER_SIZE + mlen :]


def _check_writable(manifest: dict, raw: bytes) -> None:
    """QuantError when readers would refuse this manifest for its size or nesting (a huge or
    deep config.json in the metadata): the packer never writes an artifact its reader refuses."""
    if len(raw) > spec.MAX_MANIFEST_BYTES:
        raise QuantError(
            f"the manifest would be {len(raw):,} bytes (metadata {len(dumps(manifest.get('metadata', {}))):,}, "
            f"with the model's config); artifacts hold at most {spec.MAX_MANIFEST_BYTES:,}"
        )
    if json_depth(manifest, spec.MAX_JSON_DEPTH) > spec.MAX_JSON_DEPTH:
        raise QuantError(
            f"the metadata (the model's config) nests deeper than an artifact's manifest may ({spec.MAX_JSON_DEPTH} levels)"
        )


def no_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # Python's reader takes NaN and Infinity; JSON has neither


def _manifest_json(stored: bytes, flags: int) -> bytes:
    """The manifest's JSON bytes from its stored form."""
    return compress.decompress(flags & spec.MANIFEST_COMPRESSOR_MASK, stored, spec.MAX_MANIFEST_BYTES, "manifest")


def split_container(data: bytes) -> tuple[dict, bytes]:
    """(manifest, payload) of a well-formed artifact, unvalidated: for tools that re-sign."""
    _, version, flags, mlen, _ = spec.HEADER.unpack_from(data, 0)
    stored, payload = spans(data, version, mlen)
    return json.loads(_manifest_json(bytes(stored), flags), parse_constant=no_constant), bytes(payload)


def json_depth(obj: Any, limit: int) -> int:
    """Nesting depth of parsed JSON (a scalar is 1, a list of scalars 2), stopping once past
    limit. Level by level, and only containers are walked into: manifests are wide, not deep."""
    level, depth = [obj], 1
    while True:
        children: list = []
        for o in level:
            if isinstance(o, dict):
                children.extend(o.values())
            elif isinstance(o, list):
                children.extend(o)
        if not children:
            return depth
        depth += 1
        level = [c for c in children if isinstance(c, (dict, list))]
        if depth > limit or not level:
            return depth


def read_container(data: bytes, *, hashed: bool = False) -> tuple[dict, memoryview]:
    """Check header, checksums and the manifest's structure; return (manifest, payload); its fields
    next: validate.read_container. hashed: the payload's checksum was taken as pack wrote it."""
    data = memoryview(data)
    if len(data) < spec.HEADER_SIZE:
        raise ArtifactError(f"truncated artifact: {len(data)} bytes, header needs {spec.HEADER_SIZE}")
    magic, version, flags, mlen, msha = spec.HEADER.unpack_from(data, 0)
    if magic != spec.MAGIC:
        raise ArtifactError(f"not a recurnorm artifact (magic {bytes(magic)!r}, expected {spec.MAGIC!r})")
    if version not in spec.READ_VERSIONS:
        raise ArtifactError(
            f"unsupported artifact version {version} (this reader knows {', '.join(map(str, spec.READ_VERSIONS))})"
        )
    known = spec.MANIFEST_COMPRESSOR_MASK | sum(spec.FIELD_FLAGS.values())
    if flags & ~known or (version == 1 and flags > spec.ZSTD):
        raise ArtifactError(f"unsupported artifact flags {flags:#x}")
    if mlen > spec.MAX_MANIFEST_BYTES or spec.HEADER_SIZE + mlen > len(data):
        raise ArtifactError(f"truncated artifact: manifest of {mlen} bytes does not fit")
    stored, payload = spans(data, version, mlen)
    mbytes = bytes(stored)
    if hashlib.sha256(mbytes).digest() != msha:
        raise ArtifactError("manifest checksum mismatch (corrupt or truncated artifact)")
    mbytes = _manifest_json(mbytes, flags)
    try:
        manifest = json.loads(mbytes.decode("utf-8"), parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"manifest is not valid JSON: {exc}") from None
    if json_depth(manifest, spec.MAX_JSON_DEPTH) > spec.MAX_JSON_DEPTH:
        raise ArtifactError("manifest nests too deeply")
    if not isinstance(manifest, dict):
        raise ArtifactError("manifest is not a JSON object")
    if not is_int(manifest.get("version")) or manifest.get("version") != version:
        raise ArtifactError(f"manifest version {manifest.get('version')!r} differs from the header's {version}")
    plen = manifest.get("payload_length")
    if not is_int(plen) or plen != len(payload):
        raise ArtifactError(f"truncated or padded artifact: payload is {len(payload)} bytes, manifest says {plen}")
    if not hashed:
        check_payload(manifest, payload)
    return manifest, payload


def check_payload(manifest: dict, payload: memoryview) -> None:
    """ArtifactError unless the payload's SHA-256 is the manifest's (a mapped file's pages let go as hashed)."""
    sha = hashlib.sha256()
    for i in range(0, len(payload), 1 << 26):
        sha.update(payload[i : i + (1 << 26)])
        release(payload)
    if sha.hexdigest() != manifest.get("payload_sha256"):
        raise ArtifactError("payload checksum mismatch (corrupt artifact)")


def release(data: memoryview) -> None:
    """Let go of the pages of a memory-mapped artifact read so far (read again from the file
    if needed): reading holds the tensor at hand, not the file."""
    if isinstance(data.obj, mmap.mmap) and len(data.obj):
        data.obj.madvise(mmap.MADV_DONTNEED)


def has_field(manifest: dict, field: str) -> bool:
    """True when a tensor entry carries the field (spec.FIELD_FLAGS)."""
    return any(isinstance(t, dict) and field in t for t in manifest.get("tensors", ()))


def is_int(v: Any) -> bool:
    """An int that is not a bool (JSON's true is not a number)."""
    return isinstance(v, int) and not isinstance(v, bool)
