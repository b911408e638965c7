"""Loading a YAML rules/config file: the one loader is collectors/rule_loader.py (attribution may
import collectors); these names stay for the callers in attribution/ and controller/."""

from __future__ import annotations

from faultlens.collectors.rule_loader import (
           RuleFileError,
           field_error,
           key_path,
           load_rule_document,
           load_rule_file,
           read_document,
           validate,
)

load_yaml_file = load_rule_file
validate_against = validate

__all__ = [
    "RuleFileError",
    "field_error",
    "key_path",
    "load_rule_document",
    "load_rule_file",
    "load_yaml_file",
    "read_document",
    "validate",
    "validate_against",
]
