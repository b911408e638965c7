"""docs/design.md names the code's vocabularies as they are: each vocabulary table (its first column
one backticked value a row) lists every value of its enum in the code and nothing else, and every
value the text names as a class, cause, action, status, verdict, source or tier exists in the code.
A value added to an enum without its line in design.md, or a line for a value the code does not have
(the `node_loss` cause that never existed), fails here."""

from __future__ import annotations

import ast
import re
from enum import Enum
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, DeliveryStatus
from faultlens.attribution.detectors.hang.report import HangVerdict
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.collectors.store.schema import TABLE_NAMES
from faultlens.controller.checkpoints.tiers import TierKind

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"

#: a value the text names: "cause `host`", "causes `software`", "action `drain`"
NAMED = re.compile(r"\b(class|cause|action|status|verdict|source|tier)(?:es|s)? `([^`]+)`")
ONE_VALUE = re.compile(r"^`([^`]+)`$")


def source_names() -> set[str]:
    """The `name` of every signal source in collectors/: a class with poll() and close() (the Source
    protocol) and a string `name`, found on the source so a new source cannot hide from the doc."""
    names: set[str] = set()
    for path in sorted((REPO / "collectors").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            if not {"poll", "close"} <= methods:
                continue
            for item in node.body:
                if (isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                        and any(isinstance(t, ast.Name) and t.id == "name" for t in item.targets)
                        and isinstance(item.value.value, str)):
                    names.add(item.value.value)
    return names


def _values(enum: type[Enum]) -> set[str]:
    return {member.value for member in enum}


#: the first header cell of a vocabulary table -> the values the code has
VOCABULARIES: dict[str, set[str]] = {
    "class": _values(IncidentClass),
    "cause": _values(Cause),
    "action": _values(Action),
    "status": _values(DeliveryStatus),
    "verdict": _values(HangVerdict),
    "tier": _values(TierKind),
    "source": source_names(),
    "table": set(TABLE_NAMES),
}


def first_columns(text: str) -> dict[str, list[str]]:
    """Each markdown table's first header cell -> the first cells of its rows, as written."""
    tables: dict[str, list[str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and lines[i + 1].startswith("|---")):
            continue
        key = line.strip("|").split("|")[0].strip()
        if key in tables:
            raise AssertionError(f"docs/design.md has two tables headed {key!r}")
        rows = []
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            rows.append(row.strip("|").split("|")[0].strip())
        tables[key] = rows
    return tables


def test_the_reader_finds_a_tables_first_column() -> None:
    text = "x\n\n| cause | why |\n|---|---|\n| `host` | a node |\n| `oom` | memory |\n\nafter\n"
    assert first_columns(text) == {"cause": ["`host`", "`oom`"]}
    assert [m.groups() for m in NAMED.finditer("causes `software`, action `drain`")] == [
        ("cause", "software"), ("action", "drain")]


def test_the_sources_are_found_on_the_code() -> None:
    assert {"nvml", "kmsg", "dcgm", "process", "heartbeats"} <= VOCABULARIES["source"]


def test_every_vocabulary_has_its_table() -> None:
    missing = set(VOCABULARIES) - set(first_columns(DESIGN.read_text()))
    assert not missing, f"docs/design.md has no table headed {sorted(missing)}"


@pytest.mark.parametrize("key", sorted(VOCABULARIES))
def test_the_table_names_exactly_the_codes_values(key: str) -> None:
    cells = first_columns(DESIGN.read_text())[key]
    unmarked = [cell for cell in cells if not ONE_VALUE.match(cell)]
    assert not unmarked, f"the {key} table's first column holds one `value` a row, not {unmarked}"
    named = [ONE_VALUE.match(cell)[1] for cell in cells]  # type: ignore[index]
    assert len(named) == len(set(named)), f"the {key} table names a value twice: {named}"
    code = VOCABULARIES[key]
    assert not set(named) - code, f"docs/design.md names {key} values the code lacks: " \
                                  f"{sorted(set(named) - code)}"
    assert not code - set(named), f"the code's {key} values missing from docs/design.md: " \
                                  f"{sorted(code - set(named))}"


def test_every_value_the_text_names_exists() -> None:
    wrong = [(kind, value) for kind, value in NAMED.findall(DESIGN.read_text())
             if value not in VOCABULARIES[kind]]
    assert not wrong, f"docs/design.md names values the code lacks: {wrong}"
