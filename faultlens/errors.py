"""The one base class of every faultlens error.

Each error class of the project derives from FaultlensError (and keeps its other bases, ValueError,
OSError and so on, so callers that catch those still work). The CLI translates a FaultlensError into
one line, `faultlens <command>: error: <message>`, and the exit code `exit_code` in one place
(controller/cli/main.py). This module imports nothing: the code that runs inside the training
process may import it.
"""

from __future__ import annotations


class FaultlensError(Exception):
    """A faultlens error: its message is one line, naming the file or input and the problem."""

    exit_code: int = 2  # the CLI's exit status for it: 2, bad input or path
