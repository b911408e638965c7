"""Kernels written for numba, compiled only where they pay.

Importing numba (0.35-0.55 s, scipy with it) and loading each kernel's cached machine code costs
more than a small input's whole work: a hang of a 16-rank job is a few hundred rows. A function
decorated with `kernel(...)` (the options are numba's `njit` options) runs as plain Python, the
same function on NumPy scalars that wrap as machine integers do (overflow warnings off), until
`use_compiled()` is called in the process; from then on every kernel, in every module, runs
compiled. A reader or an analysis that knows its input is large calls `compile_above(rows,
threshold)` before the work. The switch is one way and both forms give the same results (the
tests compare them), so a call made in the other form by a concurrent small analysis answers the
same.

A kernel that calls another kernel names it as a module global: compiling replaces those globals
with numba's dispatchers (numba types a call through the global it finds), and a module's callers
keep the `Kernel` object, which forwards to the compiled form.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_kernels: list[Kernel] = []
_compiled = False
_local = threading.local()  # depth of plain-Python kernel calls on this thread


class Kernel:
    """A numba-style function: plain Python until use_compiled(), compiled after."""

    def __init__(self, func: Callable[..., Any], options: dict[str, Any]) -> None:
        self.py_func = func
        self.options = options
        self.compiled: Callable[..., Any] | None = None
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any) -> Any:
        compiled = self.compiled
        if compiled is not None:
            return compiled(*args)
        if _compiled:  # defined after use_compiled(): its module's globals are bound by now
            _compile_pending()
            return self.compiled(*args)  # type: ignore[misc]
        if getattr(_local, "depth", 0):  # inside another kernel: its errstate holds
            return self.py_func(*args)
        import numpy as np

        _local.depth = 1
        try:
            with np.errstate(over="ignore"):
                return self.py_func(*args)
        finally:
            _local.depth = 0

    def _compile(self) -> None:
        from numba import njit

        self.compiled = njit(**self.options)(self.py_func)
        # calls from other kernels of its module go through the module's global
        module = sys.modules.get(self.py_func.__module__)
        if module is not None and getattr(module, self.__name__, None) is self:
            setattr(module, self.__name__, self.compiled)


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Kernel]:
    """Decorator: `@kernel(cache=True, nogil=True)` where `@njit(cache=True, nogil=True)` was.

    A kernel defined after use_compiled() is compiled at its first call, not here: its module's
    global does not name it yet, so a kernel calling it could not be typed (numba would find the
    Kernel object)."""

    def wrap(func: Callable[..., Any]) -> Kernel:
        made = Kernel(func, options)
        with _lock:
            _kernels.append(made)
        return made

    return wrap


def _compile_pending() -> None:
    """Every kernel not compiled yet (defined after use_compiled()) compiled, all at once, so that
    the kernels a compiled kernel calls are numba's dispatchers too."""
    with _lock:
        for made in _kernels:
            if made.compiled is None:
                made._compile()


def use_compiled() -> None:
    """Every kernel compiled (numba imported, machine code loaded from its cache or compiled),
    now and for kernels defined later; once per process."""
    global _compiled
    if _compiled:
        return
    with _lock:
        if _compiled:
            return
        for made in _kernels:
            made._compile()
        _compiled = True


def compile_above(rows: int, threshold: int) -> bool:
    """use_compiled() where `rows` reach `threshold`; whether the kernels are compiled."""
    if rows >= threshold:
        use_compiled()
    return _compiled


def is_compiled() -> bool:
    return _compiled
