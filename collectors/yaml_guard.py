"""Reading a rules / config YAML file safely: UTF-8 only (a UTF-16/32 file is named as such, not a
traceback), bounded size, nesting depth and alias count checked on the event stream (PyYAML's parser
is iterative; its composer and every validator after it recurse, so 20,000-deep nesting would end in
RecursionError), then yaml.safe_load. Both passes use libyaml's parser when PyYAML has it
(CSafeLoader, ~10x less CPU than the pure-Python one: rules/xid.yaml's two passes cost 0.2 s of
every `faultlens run` start), the pure-Python SafeLoader otherwise; both build the same documents.

The one rule-file loader (collectors/rule_loader.py) reads every YAML file through here and turns
these into its one-line errors: decoding problems come out as UnicodeDecodeError (with a reason that
says what the file is), limits as YamlLimitError (a yaml.YAMLError).
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml

from faultlens.errors import FaultlensError

MAX_YAML_BYTES = 4 * 1024 * 1024  # rules files are a few KB
MAX_YAML_DEPTH = 64  # the deepest real rules file nests 5 levels
# aliases expand into shared references: a "billion laughs" document for the validators
MAX_YAML_ALIASES = 256
# nodes (scalars, sequences, mappings): the largest real rules file holds a few thousand; a 4 MiB
# flow sequence of 2 million cost 76 s and 1.6 GB to build before it was refused
MAX_YAML_NODES = 100_000

#: the safe loader used for both passes: libyaml's when PyYAML was built with it
SAFE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


class YamlLimitError(yaml.YAMLError, FaultlensError):
    """The document exceeds a limit (size, depth, aliases): the message says which."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = None

    def __str__(self) -> str:
        return self.problem


def decode_yaml_bytes(data: bytes) -> str:
    """UTF-8 text of a YAML file (an UTF-8 BOM is dropped). UnicodeDecodeError for anything else,
    its reason naming UTF-16/UTF-32 when the file starts with their byte-order mark or looks like
    them (NUL bytes)."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise UnicodeDecodeError("utf-8", data[:4], 0, len(bom),
                                     f"{name} text (byte-order mark); save the file as UTF-8")
    if b"\x00" in data[:4096]:
        raise UnicodeDecodeError("utf-8", data[:4], 0, 1,
                                 "NUL bytes (UTF-16 or UTF-32 text, or binary); save the file as "
                                 "UTF-8")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    return data.decode("utf-8")


def read_yaml_text(path: str | Path) -> str:
    """The text of a YAML file: OSError when it cannot be read, UnicodeDecodeError when it is not
    UTF-8, YamlLimitError when it is larger than MAX_YAML_BYTES."""
    file = Path(path)
    with file.open("rb") as handle:
        data = handle.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        raise YamlLimitError(f"larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB")
    return decode_yaml_bytes(data)


def check_structure(text: str) -> None:
    """Raise YamlLimitError when the document nests deeper than MAX_YAML_DEPTH or holds more than
    MAX_YAML_ALIASES aliases; yaml.YAMLError when it does not parse. Runs on the event stream: no
    recursion, bounded memory."""
    if len(text) > MAX_YAML_BYTES:
        raise YamlLimitError(f"larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB")
    depth = aliases = nodes = 0
    for event in yaml.parse(text, Loader=SAFE_LOADER):
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_YAML_NODES:
                mark = event.start_mark
                raise YamlLimitError(f"more than {MAX_YAML_NODES} nodes (at line {mark.line + 1})")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                mark = event.start_mark
                raise YamlLimitError(f"nested deeper than {MAX_YAML_DEPTH} levels (at line "
                                     f"{mark.line + 1}, column "
                                     f"{mark.column + 1})")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise YamlLimitError(f"more than {MAX_YAML_ALIASES} aliases")


def safe_load_text(text: str) -> Any:
    """check_structure, then yaml.safe_load. Raises yaml.YAMLError (YamlLimitError for a limit)."""
    check_structure(text)
    try:
        return yaml.load(text, Loader=SAFE_LOADER)  # a safe loader
    except RecursionError:  # pragma: no cover - check_structure bounds the depth first
        raise YamlLimitError("nested too deeply") from None
