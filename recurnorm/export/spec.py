"""Policies as text: ``-q`` strings, ``--policy`` TOML files and ``--keep-float`` patterns.

Grammar of ``-q`` (validated here, in one place, against the quantizer registry):

- a format with options: ``int4``, ``int4:group=128``, ``int6:clip_search=true:asymmetric=true``
  (values read as true/false/none, numbers, or text);
- rules, comma separated, first match wins: ``tok_emb.weight=int8,blocks.*.mlp.*=int5,*=int6``.
  A bare format among them (``blocks.*.mlp.*=int5,int6``) is the main format.

A ``--policy`` file holds the same in TOML::

    format = "int6"                 # main format (optional; -q's when absent)
    options = { clip_search = true }
    embedding = "int8"              # optional: embedding format spec
    keep_float = ["*.bias"]         # optional: these stay fp32
    quantize_controls = false       # optional
    rules = ["tok_emb.weight=int8", "blocks.*.mlp.*=int5:group=64"]

Every error is a ConfigError (usage, exit 2) naming the bad format, option or
key and listing the known ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError, QuantError
from .policy import ExportPolicy, Rule, format_spec

POLICY_KEYS = ("format", "options", "embedding", "keep_float", "quantize_controls", "rules")


def _value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def check_format(fmt: str, options: dict[str, Any], where: str) -> None:
    """ConfigError naming an unknown format or option (or a bad value) and the known ones."""
    from ..quant import extras

    try:
        extras.split(fmt, options)
    except QuantError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_format(text: str, where: str = "-q") -> tuple[str, dict[str, Any]]:
    """``int4:group=128`` -> ("int4", {"group": 128}), validated."""
    fmt, *parts = text.strip().split(":")
    options: dict[str, Any] = {}
    key = None
    for part in parts:
        k, sep, v = part.partition("=")
        if sep and k.strip():
            key = k.strip()
            options[key] = v
        elif key is not None:  # a value holding ':' (``clip=sigma:3``) continues the previous one
            options[key] += ":" + part
        else:
            raise ConfigError(f"{where}: expected FORMAT:option=value, got {text!r}")
    options = {k: _value(v) for k, v in options.items()}
    check_format(fmt.strip(), options, where)
    return fmt.strip(), options


def _is_rule(item: str) -> bool:
    head, sep, _ = item.partition("=")
    return bool(sep) and ":" not in head


def parse_quant(text: str, where: str = "-q") -> tuple[tuple[str, dict[str, Any]] | None, list[Rule]]:
    """(main format or None, rules in order) from a -q string."""
    main = None
    rules: list[Rule] = []
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise ConfigError(f"{where}: empty format or rule in {text!r}")
    for item in items:
        if _is_rule(item):
            pattern, _, spec = item.partition("=")
            if not pattern.strip():
                raise ConfigError(f"{where}: rule {item!r} has no tensor pattern")
            fmt, opts = parse_format(spec, f"{where} rule {item!r}")
            rules.append(Rule(pattern.strip(), fmt, opts, f"{pattern.strip()}={spec.strip()}"))
        else:
            if main is not None:
                raise ConfigError(f"{where}: two main formats in {text!r} ({main[0]!r} and {item!r})")
            main = parse_format(item, where)
    return main, rules


MAX_POLICY_BYTES = 1 << 20  # a policy is a few rules: a file this large is a mistake, not a policy


def read_policy_file(path: str | Path) -> dict[str, Any]:
    """The TOML policy file as a dict; ConfigError naming the file and the bad key."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    from ..io import read_input

    path = Path(path)
    try:
        doc = tomllib.loads(read_input(path, MAX_POLICY_BYTES, "--policy").decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--policy {path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses into nested arrays and tables
        raise ConfigError(f"--policy {path}: nests too deeply") from None
    unknown = sorted(set(doc) - set(POLICY_KEYS))
    if unknown:
        raise ConfigError(f"--policy {path}: unknown key {unknown[0]!r}; known: {', '.join(POLICY_KEYS)}")
    for key, kind in (("keep_float", list), ("rules", list), ("options", dict), ("quantize_controls", bool)):
        if key in doc and not isinstance(doc[key], kind):
            raise ConfigError(f"--policy {path}: {key} must be a {'table' if kind is dict else kind.__name__}")
    for key in ("format", "embedding"):
        if key in doc and not isinstance(doc[key], str):
            raise ConfigError(f'--policy {path}: {key} must be a string like "int6" or "int4:group=64"')
    return doc


def build_policy(
    quant: str | None = "int8",
    *,
    policy_file: str | Path | None = None,
    keep_float: tuple[str, ...] | list[str] = (),
    quantize_controls: bool = False,
    keep_float_max_numel: int | None = None,
    **kw: Any,
) -> ExportPolicy:
    """The ExportPolicy for -q / --policy / --keep-float; ConfigError (usage) on anything unknown.

    Rule order: --keep-float patterns, then -q's rules, then the file's rules.
    -q's main format wins over the file's ``format``.
    """
    doc = read_policy_file(policy_file) if policy_file is not None else {}
    where = f"--policy {policy_file}"
    recipe, quant = _recipe_item(quant)
    main, rules = parse_quant(quant) if quant else (None, [])
    if recipe is not None and main is not None:
        raise ConfigError(f"-q {recipe}: a recipe is the main format; {format_spec(*main)!r} cannot join it")
    file_rules: list[Rule] = []
    for item in doc.get("rules", []):
        if not isinstance(item, str) or not _is_rule(item):
            raise ConfigError(f"{where}: rules must be 'PATTERN=FORMAT' strings, got {item!r}")
        file_rules += parse_quant(item, where)[1]
    if main is None and "format" in doc:
        fmt, opts = parse_format(str(doc["format"]), where)
        extra = doc.get("options", {})
        if not isinstance(extra, dict):
            raise ConfigError(f"{where}: options must be a table, got {extra!r}")
        check_format(fmt, {**opts, **extra}, where)
        main = (fmt, {**opts, **extra})
    main = main or ("int8", {})
    keep = [*keep_float, *doc.get("keep_float", [])]
    for pattern in keep:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"keep_float patterns must be non-empty strings, got {pattern!r}")
    kept = [Rule(p, "fp32", {}, f"keep-float {p}") for p in keep]
    args: dict[str, Any] = {
        "quantizer": main[0],
        "options": main[1],
        "rules": tuple(kept + rules + file_rules),
        "quantize_controls": bool(quantize_controls or doc.get("quantize_controls", False)),
        **kw,
    }
    if "embedding" in doc:
        args["embedding_format"], args["embedding_options"] = parse_format(str(doc["embedding"]), where)
    if keep_float_max_numel is not None:
        args["keep_float_max_numel"] = keep_float_max_numel
    try:
        if recipe is not None:
            from .recipes import recipe_policy

            args = {k: v for k, v in args.items() if k not in ("quantizer", "options")}
            return recipe_policy(recipe, **args)
        return ExportPolicy(**args)
    except QuantError as exc:
        raise ConfigError(str(exc)) from None


def _recipe_item(quant: str | None) -> tuple[str | None, str | None]:
    """(``@NAME`` if -q names a recipe, the rest of -q): ``@pg-record,tok_emb.weight=int8``."""
    if not quant:
        return None, quant
    items = [s.strip() for s in quant.split(",")]
    named = [s for s in items if s.startswith("@")]
    if not named:
        return None, quant
    if len(named) > 1:
        raise ConfigError(f"-q: two recipes in {quant!r}")
    rest = ",".join(s for s in items if not s.startswith("@"))
    return named[0], rest or None
