"""The one loader of every YAML rules/config file (rules/*.yaml, hook files, GPU timelines, campaign
scenarios).

    # a pydantic model: the file's schema
    rules = load_rule_file(path, CrashRules, error=RulesError)

Every rule file is described by a pydantic model (the only validation library of the runtime
package; shared field types in collectors/rule_model.py).

Reading goes through collectors/yaml_guard.py (UTF-8 only, size, nesting depth and alias limits
checked before yaml.safe_load builds anything). Every problem is one RuleFileError (or the caller's
subclass) of one shape, one line, naming the file and the field path:

    rules/policy.yaml: rules[3].when.class[0]: expected one of crash, collective_hang, straggler,
    got 'crsh' rules/crash.yaml: line 4, column 3: not valid YAML: expected ',' or ']', but got
    '<stream end>' rules/xid.yaml: cannot read: No such file or directory

`field_error` gives a caller's own checks (unique ids, cross references) the same shape. The CLI
prints a RuleFileError as one line and exits 2 (it is a FaultlensError).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from faultlens.collectors.yaml_guard import read_yaml_text, safe_load_text
from faultlens.errors import FaultlensError


class RuleFileError(ValueError, FaultlensError):
    """A rules or config file is unreadable or does not fit its schema: `<file>: <field path>:
    <expectation>`.
    """


E = TypeVar("E", bound=RuleFileError)
T = TypeVar("T")


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


def field_error(
    source: str, parts: Sequence[Any], expectation: str, error: type[E] = RuleFileError
) -> E:
    """The one shape: `<source>: <field path>: <expectation>` (on one line)."""
    return error(" ".join(f"{source}: {key_path(parts)}: {expectation}".split("\n")))


def read_document(path: str | Path, *, error: type[E] = RuleFileError) -> Any:
    """The parsed YAML document of `path` (hostile-input limits first); `error` for any problem,
    naming the file.
    """
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


# ---------------------------------------------------------------- pydantic errors -> the same
# expectation


def _model_expectation(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        return "unknown key (not allowed here)"
    if kind == "string_pattern_mismatch":
        return (f"expected text matching {(item.get('ctx') or {}).get('pattern')}, got "
                f"{_got(item.get('input'))}")
    message = str(item.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    if message.startswith("Input should be "):
        message = message[len("Input should be "):]
        if kind in ("enum", "literal_error"):
            choices = message.replace("'", "").replace(" or ", ", ")
            message = "one of " + choices if ", " in choices else choices
    value = item.get("input")
    got = "" if isinstance(value, dict) else f", got {_got(value)}"
    return f"expected {message}{got}"


def _path(document: Any, loc: Sequence[Any]) -> list[Any]:
    """The field path of a pydantic error location in the document: without the labels pydantic adds
    for union members (`function-after[...]`, a tagged union's tag), which are no key of the
    document."""
    parts: list[Any] = []
    node = document
    last = max((i for i, p in enumerate(loc) if not (isinstance(p, str) and "[" in p)), default=-1)
    for position, part in enumerate(loc):
        if isinstance(part, str) and "[" in part:
            continue
        if (isinstance(part, str) and isinstance(node, dict) and position < last
                and not isinstance(node.get(part), (dict, list))):
            # a tag label (the path goes on below it, so it is no leaf key; a missing key is the
            # last part)
            continue
        parts.append(part)
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return parts


def describe(exc: Any, document: Any) -> tuple[list[Any], str]:
    """(field path, expectation) of the first problem of a pydantic ValidationError: first the
    problems inside a section the document has (what its author wrote), then the shallowest; `(and N
    more problems)` added."""
    written = set(document) if isinstance(document, dict) else set()
    items = sorted(exc.errors(), key=lambda e: (not (len(e["loc"]) > 1 and e["loc"][0] in written),
                                                len(e["loc"])))
    item = items[0]
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    parts = _path(document, item["loc"])
    ctx = item.get("ctx") or {}
    if item.get("type") == "union_tag_invalid":
        tags = str(ctx.get("expected_tags", "")).replace("'", "")
        return [*parts, str(ctx.get("discriminator", "")).strip("'")], \
            f"expected one of {tags}, got {_got(ctx.get('tag'))}{more}"
    if item.get("type") == "union_tag_not_found":
        return [
            *parts,
            str(ctx.get("discriminator", "")).strip("'"),
        ], f"required key is missing{more}"
    return parts, _model_expectation(item) + more


def validate(document: Any, model: type[T], source: str, *, error: type[E] = RuleFileError) -> T:
    """Check `document` against the pydantic model class `model`; `error` for the first problem (see
    describe). Returns the model instance."""
    from pydantic import ValidationError

    try:
        return model.model_validate(document)  # type: ignore[attr-defined, no-any-return]
    except ValidationError as exc:
        parts, expectation = describe(exc, document)
        raise field_error(source, parts, expectation, error) from None


def load_rule_file(path: str | Path, model: type[T], *, error: type[E] = RuleFileError,
                   versions: tuple[int, ...] | None = (1,),
                   prepare: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None) -> T:
    """Read `path` (read_document), require a mapping whose `format_version` is one of `versions`
    (None: no check), apply `prepare(path, document)` (e.g. `extends:`), then `validate` against
    `model`."""
    path = Path(path)
    document = read_document(path, error=error)
    if not isinstance(document, dict):
        raise field_error(
            str(path), [], f"expected a mapping, got {type(document).__name__}", error
        )
    if prepare is not None:
        document = prepare(path, document)
    if versions is not None:
        version = document.get("format_version")
        if version not in versions:
            expected = " or ".join(str(v) for v in versions)
            raise field_error(
                str(path), ["format_version"], f"expected {expected}, got {version!r}", error
            )
    return validate(document, model, str(path), error=error)


def load_rule_document(
    path: str | Path,
    model: type,
    *,
    error: type[E] = RuleFileError,
    versions: tuple[int, ...] | None = (1,),
    prepare: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """load_rule_file for a caller that reads the file's plain data: the document, validated against
    `model`.
    """
    documents: list[dict[str, Any]] = []

    def keep(file: Path, document: dict[str, Any]) -> dict[str, Any]:
        document = prepare(file, document) if prepare is not None else document
        documents.append(document)
        return document

    load_rule_file(path, model, error=error, versions=versions, prepare=keep)
    return documents[0]
