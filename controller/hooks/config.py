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
      - {type: slurm, name: slurm, state_dir: /shared/faultlens/slurm, slurm_conf:
        /etc/slurm/slurm.conf, drain: true}
      - {type: alertmanager, name: page, url: "http://alertmanager:9093", actions: [escalate,
        drain], store: s3://bucket/store}

BUILDERS maps each `type` to the function that builds its hook (the registry of hook kinds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from faultlens.attribution.decision import Action
from faultlens.attribution.rulefile import RuleFileError, load_rule_document, validate_against
from faultlens.collectors.rule_model import FileModel, FormatVersion1, NonNegative, Text
from faultlens.controller.hooks.alertmanager import AlertmanagerHook
from faultlens.controller.hooks.base import Hook, RetryPolicy
from faultlens.controller.hooks.command import CommandHook
from faultlens.controller.hooks.entrypoint import EntryPointHookError, load_entry_point_hook
from faultlens.controller.hooks.filedrop import FileDropHook
from faultlens.controller.hooks.slurm import SlurmHook, slurm_env_from
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


class _Slurm(_Hook):
    type: Literal["slurm"]
    state_dir: Text
    slurm_conf: str | None = None
    drain: bool | None = None


class _Alertmanager(_Hook):
    type: Literal["alertmanager"]
    url: Annotated[str, Field(pattern="^https?://")]
    actions: list[Literal[tuple(a.value for a in Action if a is not Action.UNKNOWN)]] | None = None
    store: str | None = None
    timeout_s: _Positive | None = None


class HooksFile(FileModel):
    """A hooks file (rules/hooks.example.yaml)."""

    format_version: FormatVersion1
    hooks: list[
        Annotated[
            _Webhook | _Command | _FileDrop | _EntryPoint | _Slurm | _Alertmanager,
            Field(discriminator="type"),
        ]
    ]


def _retry(item: Mapping[str, Any]) -> RetryPolicy | None:
    raw = item.get("retry")
    return None if raw is None else RetryPolicy(**raw)


_Builder = Callable[[Mapping[str, Any], str, RetryPolicy | None], Hook]


def _webhook(item: Mapping[str, Any], name: str, retry: RetryPolicy | None) -> Hook:
    return WebhookHook(
        item["url"],
        secret=item.get("secret"),
        secret_env=item.get("secret_env"),
        name=name,
        timeout_s=item.get("timeout_s", 10.0),
        headers=item.get("headers"),
        retry=retry,
    )


def _command(item: Mapping[str, Any], name: str, retry: RetryPolicy | None) -> Hook:
    return CommandHook(
        item["command"],
        name=name,
        timeout_s=item.get("timeout_s", 60.0),
        env=item.get("env"),
        cwd=item.get("cwd"),
        retry=retry,
    )


def _file(item: Mapping[str, Any], name: str, retry: RetryPolicy | None) -> Hook:
    return FileDropHook(item["directory"], name=name, retry=retry)


def _entry_point(item: Mapping[str, Any], name: str, retry: RetryPolicy | None) -> Hook:
    return load_entry_point_hook(item["entry_point"], item.get("options"), name=name, retry=retry)


def _slurm(item: Mapping[str, Any], name: str, retry: RetryPolicy | None) -> Hook:
    return SlurmHook(
        item["state_dir"],
        name=name,
        slurm_env=slurm_env_from(item),
        drain_nodes=item.get("drain", True),
        retry=retry,
    )


def _alertmanager(item: Mapping[str, Any], name: str, retry: RetryPolicy | None) -> Hook:
    actions = item.get("actions")
    return AlertmanagerHook(
        item["url"],
        name=name,
        store=item.get("store"),
        timeout_s=item.get("timeout_s", 10.0),
        retry=retry,
        **({} if actions is None else {"actions": actions}),
    )


#: hook type (a hooks file's `type:`) -> its builder
BUILDERS: dict[str, _Builder] = {
    "webhook": _webhook,
    "command": _command,
    "file": _file,
    "entry_point": _entry_point,
    "slurm": _slurm,
    "alertmanager": _alertmanager,
}


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
            raise HookConfigError(
                f"{source}: hooks[{index}].name: expected a unique name, {name!r} is used twice"
            )
        names.add(name)
        try:
            hook = BUILDERS[kind](item, name, _retry(item))
        except (ValueError, TypeError, EntryPointHookError) as exc:
            raise HookConfigError(f"{source}: hooks[{index}] ({name}): {exc}") from None
        hooks.append(hook)
    return hooks


def load_hooks(path: str | Path) -> list[Hook]:
    document = load_rule_document(path, HooksFile, error=HookConfigError)
    return hooks_from_config(document["hooks"], source=str(path))
