"""Hook configuration: a YAML file (format_version 1) or the same items built from arguments.

    format_version: 1
    hooks:
      - {type: webhook, name: controller, url: "https://ctl/hooks/faultlens", secret_env:
        FAULTLENS_HOOK_SECRET,
         timeout_s: 5, retry: {attempts: 5, initial_s: 0.5, factor: 2, max_s: 30}}
      - {type: command, name: requeue, command: ["/opt/slurm/requeue.sh"], timeout_s: 30}
      - {type: file, name: spool, directory: /var/spool/faultlens}
      - {type: entry_point, name: restore, entry_point: restore, options: {tiers: [...], plan_file:
        plan.json}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from faultlens.attribution.rulefile import RuleFileError, load_rule_document, validate_against
from faultlens.collectors.rule_model import FileModel, FormatVersion1, NonNegative, Text
from faultlens.controller.hooks.base import Hook, RetryPolicy
from faultlens.controller.hooks.command import CommandHook
from faultlens.controller.hooks.entrypoint import EntryPointHookError, load_entry_point_hook
from faultlens.controller.hooks.filedrop import FileDropHook
from faultlens.controller.hooks.webhook import WebhookHook


class HookConfigError(RuleFileError):
    """A hooks file or item is invalid: `<file>: <key>: <expectation>`."""


_Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
_Positive = Annotated[float, Field(gt=0)]


class _Retry(FileModel):
    attempts: Annotated[int, Field(ge=1)] | None = None
    initial_s: NonNegative | None = None
    factor: Annotated[float, Field(ge=1)] | None = None
    max_s: NonNegative | None = None


class _Hook(FileModel):
    name: _Name | None = None
    retry: _Retry | None = None


class _Webhook(_Hook):
    type: Literal["webhook"]
    url: Annotated[str, Field(pattern="^https?://")]
    secret: str | None = None
    secret_env: str | None = None
    timeout_s: _Positive | None = None
    headers: dict[str, str] | None = None


class _Command(_Hook):
    type: Literal["command"]
    command: Text | Annotated[list[str], Field(min_length=1)]
    timeout_s: _Positive | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None


class _FileDrop(_Hook):
    type: Literal["file"]
    directory: Text


class _EntryPoint(_Hook):
    type: Literal["entry_point"]
    entry_point: Text
    options: dict[str, Any] | None = None


class HooksFile(FileModel):
    """A hooks file (rules/hooks.example.yaml)."""

    format_version: FormatVersion1
    hooks: list[
        Annotated[_Webhook | _Command | _FileDrop | _EntryPoint, Field(discriminator="type")]
    ]


def _retry(item: Mapping[str, Any]) -> RetryPolicy | None:
    raw = item.get("retry")
    return None if raw is None else RetryPolicy(**raw)


def hooks_from_config(items: Iterable[Mapping[str, Any]], *, source: str = "hooks") -> list[Hook]:
    """Build hooks from config items (validated here too, so arguments get the same checks as a
    file).
    """
    items = list(items)
    validate_against(
        {"format_version": 1, "hooks": items}, HooksFile, source, error=HookConfigError
    )
    hooks: list[Hook] = []
    names: set[str] = set()
    for index, item in enumerate(items):
        kind = item["type"]
        name = item.get("name", kind)
        if name in names:
            raise HookConfigError(f"{source}: hooks[{index}].name: expected a unique name, "
                                  f"{name!r} is used twice")
        names.add(name)
        try:
            if kind == "webhook":
                hook: Hook = WebhookHook(
                    item["url"],
                    secret=item.get("secret"),
                    secret_env=item.get("secret_env"),
                    name=name,
                    timeout_s=item.get("timeout_s", 10.0),
                    headers=item.get("headers"),
                    retry=_retry(item),
                )
            elif kind == "command":
                hook = CommandHook(
                    item["command"],
                    name=name,
                    timeout_s=item.get("timeout_s", 60.0),
                    env=item.get("env"),
                    cwd=item.get("cwd"),
                    retry=_retry(item),
                )
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
    document = load_rule_document(path, HooksFile, error=HookConfigError)
    return hooks_from_config(document["hooks"], source=str(path))
