"""Loading a YAML rules/config file against a JSON Schema: a bad file fails fast with the file, the key inside it
and what was expected (DESIGN.md "Conventions")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from faultlens.collectors.yaml_guard import read_yaml_text, safe_load_text


class RuleFileError(ValueError):
    """A rules or config file is unreadable or does not fit its schema: `<file>: <key>: <expectation>`."""


def key_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def validate_against(document: Any, schema: Mapping[str, Any], source: str) -> None:
    """Raise RuleFileError for the first (shallowest) schema violation of `document`."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: (len(e.absolute_path), str(list(e.absolute_path))))
    if errors:
        error = errors[0]
        raise RuleFileError(f"{source}: {key_path(error.absolute_path)}: {error.message}")


def load_yaml_file(path: str | Path, schema: Mapping[str, Any], *, versions: tuple[int, ...] = (1,)) -> dict:
    """Read `path` as YAML, check `format_version` is one of `versions`, validate against `schema`."""
    path = Path(path)
    try:
        text = read_yaml_text(path)
    except OSError as exc:
        raise RuleFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RuleFileError(f"{path}: not UTF-8 text: {exc.reason} (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise RuleFileError(f"{path}: {exc}") from None
    return load_yaml_text(text, schema, source=str(path), versions=versions)


def load_yaml_text(text: str, schema: Mapping[str, Any], *, source: str, versions: tuple[int, ...] = (1,)) -> dict:
    try:
        document = safe_load_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RuleFileError(f"{source}: {where}not valid YAML: {problem}") from None
    if not isinstance(document, dict):
        raise RuleFileError(f"{source}: (top level): expected a mapping, got {type(document).__name__}")
    version = document.get("format_version")
    if version not in versions:
        expected = " or ".join(str(v) for v in versions)
        raise RuleFileError(f"{source}: format_version: expected {expected}, got {version!r}")
    validate_against(document, schema, source)
    return document
