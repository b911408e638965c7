"""The one loader of every YAML rules/config file (rules/*.yaml, hook files, GPU timelines, campaign scenarios).

    document = load_rule_file(path, SCHEMA, error=PolicyError)   # a JSON Schema (dict) ...
    rules = load_rule_file(path, CrashRules, error=RulesError)   # ... or a pydantic model

Reading goes through collectors/yaml_guard.py (UTF-8 only, size, nesting depth and alias limits checked before
yaml.safe_load builds anything). Every problem is one RuleFileError (or the caller's subclass) of one shape, one
line, naming the file and the field path:

    rules/policy.yaml: rules[3].when.class[0]: expected one of crash, collective_hang, straggler, got 'crsh'
    rules/crash.yaml: line 4, column 3: not valid YAML: expected ',' or ']', but got '<stream end>'
    rules/xid.yaml: cannot read: No such file or directory

`field_error` gives a caller's own checks (unique ids, cross references) the same shape. The CLI prints a
RuleFileError as one line and exits 2 (it is a FaultlensError).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from faultlens.collectors.errors import FaultlensError
from faultlens.collectors.yaml_guard import read_yaml_text, safe_load_text


class RuleFileError(ValueError, FaultlensError):
    """A rules or config file is unreadable or does not fit its schema: `<file>: <field path>: <expectation>`."""


E = TypeVar("E", bound=RuleFileError)
T = TypeVar("T")
Spec = Mapping[str, Any] | type  # a JSON Schema, or a pydantic model class


def key_path(parts: Sequence[Any]) -> str:
    """`rules[3].when.class` from ("rules", 3, "when", "class"); `(top level)` for none."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def field_error(source: str, parts: Sequence[Any], expectation: str, error: type[E] = RuleFileError) -> E:
    """The one shape: `<source>: <field path>: <expectation>` (on one line)."""
    return error(" ".join(f"{source}: {key_path(parts)}: {expectation}".split("\n")))


def read_document(path: str | Path, *, error: type[E] = RuleFileError) -> Any:
    """The parsed YAML document of `path` (hostile-input limits first); `error` for any problem, naming the file."""
    path = Path(path)
    try:
        text = read_yaml_text(path)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text: {exc.reason} (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: {exc}") from None
    return parse_text(text, source=str(path), error=error)


def parse_text(text: str, *, source: str, error: type[E] = RuleFileError) -> Any:
    try:
        return safe_load_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{source}: {where}not valid YAML: {problem}") from None


# ---------------------------------------------------------------- JSON Schema errors -> one expectation

_TYPES = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
          "number": "a number", "boolean": "true or false", "null": "null"}


def _schema_expectation(error: Any) -> tuple[list[Any], str]:
    """(field path, expectation) of one jsonschema ValidationError."""
    parts = list(error.absolute_path)
    kind, value, instance = error.validator, error.validator_value, error.instance
    if kind == "required":
        missing = next((k for k in value if isinstance(instance, dict) and k not in instance), value[0])
        return [*parts, missing], "required key is missing"
    if kind == "additionalProperties" and isinstance(instance, dict):
        known = set((error.schema or {}).get("properties", {}))
        extra = sorted(str(k) for k in instance if k not in known)
        if extra:
            return [*parts, extra[0]], "unknown key (not allowed here)"
    if kind == "enum":
        return parts, f"expected one of {', '.join(str(v) for v in value)}, got {_got(instance)}"
    if kind == "const":
        return parts, f"expected {value!r}, got {_got(instance)}"
    if kind == "type":
        names = value if isinstance(value, list) else [value]
        return parts, f"expected {' or '.join(_TYPES.get(n, n) for n in names)}, got {_got(instance)}"
    bounds = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "greater than",
              "exclusiveMaximum": "less than"}
    if kind in bounds:
        return parts, f"expected a number {bounds[kind]} {value}, got {_got(instance)}"
    if kind == "pattern":
        return parts, f"expected text matching {value}, got {_got(instance)}"
    if kind in ("minItems", "minLength", "minProperties"):
        unit = {"minItems": "items", "minLength": "characters", "minProperties": "keys"}[kind]
        return parts, f"expected at least {value} {unit}, got {_got(instance)}"
    if kind == "uniqueItems":
        return parts, f"expected unique items, got {_got(instance)}"
    return parts, f"expected {error.message}"


def _validate_schema(document: Any, schema: Mapping[str, Any], source: str, error: type[E]) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document),
                    key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    if errors:
        parts, expectation = _schema_expectation(errors[0])
        raise field_error(source, parts, expectation, error)


# ---------------------------------------------------------------- pydantic errors -> the same expectation


def _model_expectation(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key (not allowed here)"
    message = str(item.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    if message.startswith("Input should be "):
        message = message[len("Input should be "):]
        if kind in ("enum", "literal_error"):
            message = "one of " + message.replace("'", "").replace(" or ", ", ")
    value = item.get("input")
    got = "" if isinstance(value, dict) else f", got {_got(value)}"
    return f"expected {message}{got}"


def _validate_model(document: Any, model: type[T], source: str, error: type[E]) -> T:
    from pydantic import ValidationError

    try:
        return model.model_validate(document)  # type: ignore[attr-defined]
    except ValidationError as exc:
        # first the problems inside a section the file has (what its author wrote), then the shallowest
        written = set(document) if isinstance(document, dict) else set()
        items = sorted(exc.errors(), key=lambda e: (not (len(e["loc"]) > 1 and e["loc"][0] in written),
                                                    len(e["loc"])))
        item = items[0]
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        parts = [p for p in item["loc"] if not (isinstance(p, str) and "[" in p)]  # tagged-union labels
        raise field_error(source, parts, _model_expectation(item) + more, error) from None


def validate(document: Any, spec: Spec, source: str, *, error: type[E] = RuleFileError) -> Any:
    """Check `document` against `spec` (a JSON Schema dict or a pydantic model class); `error` for the first
    (shallowest) problem. Returns the model instance (pydantic) or the document (JSON Schema)."""
    if isinstance(spec, Mapping):
        _validate_schema(document, spec, source, error)
        return document
    return _validate_model(document, spec, source, error)


def load_rule_file(path: str | Path, spec: Spec, *, error: type[E] = RuleFileError,
                   versions: tuple[int, ...] | None = (1,),
                   prepare: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None) -> Any:
    """Read `path` (read_document), require a mapping whose `format_version` is one of `versions` (None: no
    check), apply `prepare(path, document)` (e.g. `extends:`), then `validate` against `spec`."""
    path = Path(path)
    document = read_document(path, error=error)
    if not isinstance(document, dict):
        raise field_error(str(path), [], f"expected a mapping, got {type(document).__name__}", error)
    if prepare is not None:
        document = prepare(path, document)
    if versions is not None:
        version = document.get("format_version")
        if version not in versions:
            expected = " or ".join(str(v) for v in versions)
            raise field_error(str(path), ["format_version"], f"expected {expected}, got {version!r}", error)
    return validate(document, spec, str(path), error=error)
