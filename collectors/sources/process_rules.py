"""The error-text rules of the process source (rules/process_errors.yaml): which text is an OOM, a
communication error, a watchdog timeout, and which of those are survivors' echoes of someone else's
failure.

Rules are data: the file carries `format_version`, is validated with pydantic, and a bad file fails
fast with a ProcessRulesError naming the file, the key and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from faultlens.collectors.rule_loader import RuleFileError, load_rule_file
from faultlens.resources import rule_file, shipped_rule_file

# the packaged file; loading reads rule_file
DEFAULT_RULES_PATH = shipped_rule_file("process_errors.yaml")
SUPPORTED_FORMAT_VERSIONS = (1,)


class EventKind(StrEnum):
    """process_events.kind (interface 3)."""

    START = "start"
    EXIT = "exit"
    EXCEPTION = "exception"
    OOM = "oom"
    COMM_ERROR = "comm_error"
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    UNKNOWN = "unknown"


class ProcessRulesError(RuleFileError):
    """rules/process_errors.yaml is missing or invalid: the message names the file, the key and the
    expectation.
    """


class _Pattern(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    kind: EventKind
    secondary: bool
    regex: str = Field(min_length=1)
    description: str = ""

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"a valid regular expression ({exc})") from None
        return value

    @field_validator("kind")
    @classmethod
    def _error_kind(cls, value: EventKind) -> EventKind:
        if value in (EventKind.START, EventKind.EXIT, EventKind.UNKNOWN):
            raise ValueError("one of exception, oom, comm_error, watchdog_timeout")
        return value


class _RulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int
    patterns: list[_Pattern]

    @field_validator("format_version")
    @classmethod
    def _supported(cls, value: int) -> int:
        if value not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(f"one of {SUPPORTED_FORMAT_VERSIONS}")
        return value


@dataclass(frozen=True)
class Classification:
    kind: EventKind
    is_secondary: bool
    rule: str | None


@dataclass(frozen=True)
class ProcessRules:
    patterns: tuple[tuple[str, EventKind, bool, re.Pattern[str]], ...]
    path: str

    def classify(self, text: str) -> Classification:
        """The first matching pattern decides; text nothing matches is a plain exception, primary.
        """
        for rule_id, kind, secondary, regex in self.patterns:
            if regex.search(text):
                return Classification(kind, secondary, rule_id)
        return Classification(EventKind.EXCEPTION, False, None)

    def match(self, text: str) -> Classification | None:
        """Like classify, but None when no pattern matches (for scanning free log lines)."""
        found = self.classify(text)
        return found if found.rule is not None else None


def load_process_rules(path: str | Path | None = None) -> ProcessRules:
    """Load and validate the rules file (default: process_errors.yaml of the rules directory,
    $FAULTLENS_RULES else the packaged rules/)."""
    return _load(str(Path(path) if path is not None else rule_file("process_errors.yaml")))


@lru_cache(maxsize=8)
def _load(path: str) -> ProcessRules:
    parsed = load_rule_file(path, _RulesFile, error=ProcessRulesError, versions=None)
    return ProcessRules(
        tuple((p.id, p.kind, p.secondary, re.compile(p.regex)) for p in parsed.patterns), path)
