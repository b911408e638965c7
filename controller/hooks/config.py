"""Hook configuration: a YAML file (format_version 1) or the same items built from arguments.

    format_version: 1
    hooks:
      - {type: webhook, name: controller, url: "https://ctl/hooks/faultlens", secret_env: FAULTLENS_HOOK_SECRET,
         timeout_s: 5, retry: {attempts: 5, initial_s: 0.5, factor: 2, max_s: 30}}
      - {type: command, name: requeue, command: ["/opt/slurm/requeue.sh"], timeout_s: 30}
      - {type: file, name: spool, directory: /var/spool/faultlens}
      - {type: entry_point, name: restore, entry_point: restore, options: {tiers: [...], plan_file: plan.json}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from faultlens.attribution.rulefile import RuleFileError, load_yaml_file, validate_against
from faultlens.controller.hooks.base import Hook, RetryPolicy
from faultlens.controller.hooks.command import CommandHook
from faultlens.controller.hooks.entrypoint import EntryPointHookError, load_entry_point_hook
from faultlens.controller.hooks.filedrop import FileDropHook
from faultlens.controller.hooks.webhook import WebhookHook


class HookConfigError(RuleFileError):
    """A hooks file or item is invalid: `<file>: <key>: <expectation>`."""


_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,64}$"}
_RETRY = {"type": "object", "additionalProperties": False,
          "properties": {"attempts": {"type": "integer", "minimum": 1}, "initial_s": {"type": "number", "minimum": 0},
                         "factor": {"type": "number", "minimum": 1}, "max_s": {"type": "number", "minimum": 0}}}
_COMMON = {"type": {}, "name": _NAME, "retry": _RETRY}

HOOKS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["format_version", "hooks"],
    "properties": {
        "format_version": {"const": 1},
        "hooks": {"type": "array", "items": {"$ref": "#/$defs/hook"}},
    },
    "$defs": {
        "hook": {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": ["webhook", "command", "file", "entry_point"]}},
            "allOf": [
                {"if": {"properties": {"type": {"const": "webhook"}}},
                 "then": {"required": ["url"], "additionalProperties": False, "properties": {
                     **_COMMON, "url": {"type": "string", "pattern": "^https?://"}, "secret": {"type": "string"},
                     "secret_env": {"type": "string"}, "timeout_s": {"type": "number", "exclusiveMinimum": 0},
                     "headers": {"type": "object", "additionalProperties": {"type": "string"}}}}},
                {"if": {"properties": {"type": {"const": "command"}}},
                 "then": {"required": ["command"], "additionalProperties": False, "properties": {
                     **_COMMON, "command": {"oneOf": [{"type": "string", "minLength": 1},
                                                      {"type": "array", "minItems": 1,
                                                       "items": {"type": "string"}}]},
                     "timeout_s": {"type": "number", "exclusiveMinimum": 0}, "cwd": {"type": "string"},
                     "env": {"type": "object", "additionalProperties": {"type": "string"}}}}},
                {"if": {"properties": {"type": {"const": "file"}}},
                 "then": {"required": ["directory"], "additionalProperties": False, "properties": {
                     **_COMMON, "directory": {"type": "string", "minLength": 1}}}},
                {"if": {"properties": {"type": {"const": "entry_point"}}},
                 "then": {"required": ["entry_point"], "additionalProperties": False, "properties": {
                     **_COMMON, "entry_point": {"type": "string", "minLength": 1}, "options": {"type": "object"}}}},
            ],
        }
    },
}


def _retry(item: Mapping[str, Any]) -> RetryPolicy | None:
    raw = item.get("retry")
    return None if raw is None else RetryPolicy(**raw)


def hooks_from_config(items: Iterable[Mapping[str, Any]], *, source: str = "hooks") -> list[Hook]:
    """Build hooks from config items (validated here too, so arguments get the same checks as a file)."""
    items = list(items)
    validate_against({"format_version": 1, "hooks": items}, HOOKS_SCHEMA, source)
    hooks: list[Hook] = []
    names: set[str] = set()
    for index, item in enumerate(items):
        kind = item["type"]
        name = item.get("name", kind)
        if name in names:
            raise HookConfigError(f"{source}: hooks[{index}].name: expected a unique name, {name!r} is used twice")
        names.add(name)
        try:
            if kind == "webhook":
                hook: Hook = WebhookHook(item["url"], secret=item.get("secret"), secret_env=item.get("secret_env"),
                                         name=name, timeout_s=item.get("timeout_s", 10.0),
                                         headers=item.get("headers"), retry=_retry(item))
            elif kind == "command":
                hook = CommandHook(item["command"], name=name, timeout_s=item.get("timeout_s", 60.0),
                                   env=item.get("env"), cwd=item.get("cwd"), retry=_retry(item))
            elif kind == "file":
                hook = FileDropHook(item["directory"], name=name, retry=_retry(item))
            else:
                hook = load_entry_point_hook(item["entry_point"], item.get("options"), name=name,
                                             retry=_retry(item))
        except (ValueError, TypeError, EntryPointHookError) as exc:
            raise HookConfigError(f"{source}: hooks[{index}] ({name}): {exc}") from None
        hooks.append(hook)
    return hooks


def load_hooks(path: str | Path) -> list[Hook]:
    try:
        document = load_yaml_file(path, HOOKS_SCHEMA)
    except RuleFileError as exc:
        raise HookConfigError(str(exc)) from None
    return hooks_from_config(document["hooks"], source=str(path))
