"""Command hook: run a program with the decision JSON on stdin (and FAULTLENS_DECISION_ID /
FAULTLENS_DECISION_ACTION in its environment). Exit 0 is delivered; anything else is a failure to
retry."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from faultlens.attribution.decision import Decision
from faultlens.controller.hooks.base import HookError, PermanentHookError, RetryPolicy


class CommandHook:
    def __init__(
        self,
        command: str | Sequence[str],
        *,
        name: str = "command",
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.argv = (
            shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
        )
        if not self.argv:
            raise ValueError(f"command hook {name}: empty command")
        self.name = name
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.cwd = cwd
        self.retry = retry

    def deliver(self, decision: Decision, document: str) -> None:
        env = {**os.environ, **self.env, "FAULTLENS_DECISION_ID": decision.decision_id,
               "FAULTLENS_DECISION_ACTION": decision.action.value}
        try:
            result = subprocess.run(
                self.argv,
                input=document.encode(),
                capture_output=True,
                env=env,
                cwd=self.cwd,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise PermanentHookError(f"{self.argv[0]}: no such program") from None
        except PermissionError:
            raise PermanentHookError(f"{self.argv[0]}: not executable") from None
        except subprocess.TimeoutExpired:
            raise HookError(f"{self.argv[0]}: no exit within {self.timeout_s}s") from None
        if result.returncode != 0:
            tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise HookError(f"{self.argv[0]}: exit {result.returncode}: {tail[0][:300]}")
