"""Decision hooks: how a decision reaches the job controller (webhook, command, file drop, entry
point, Slurm, Alertmanager).
"""

from faultlens.controller.hooks.alertmanager import AlertmanagerHook
from faultlens.controller.hooks.base import Hook, HookError, PermanentHookError, RetryPolicy
from faultlens.controller.hooks.command import CommandHook
from faultlens.controller.hooks.config import HookConfigError, hooks_from_config, load_hooks
from faultlens.controller.hooks.entrypoint import load_entry_point_hook
from faultlens.controller.hooks.filedrop import FileDropHook
from faultlens.controller.hooks.slurm import SlurmHook
from faultlens.controller.hooks.webhook import WebhookHook, sign, verify_signature

__all__ = [
    "AlertmanagerHook",
    "CommandHook",
    "FileDropHook",
    "Hook",
    "HookConfigError",
    "HookError",
    "PermanentHookError",
    "RetryPolicy",
    "SlurmHook",
    "WebhookHook",
    "hooks_from_config",
    "load_entry_point_hook",
    "load_hooks",
    "sign",
    "verify_signature",
]
