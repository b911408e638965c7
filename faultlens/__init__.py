"""faultlens: fault attribution for large distributed training jobs.

One import namespace over the repository's rooms: `faultlens.collectors`, `faultlens.attribution`,
`faultlens.controller` and `faultlens.rules` (the shipped rule files, package data). In a wheel they
are subpackages of this directory. In a source checkout they stay where they are (collectors/,
attribution/, controller/, rules/ beside this directory); setup.py maps them with setuptools'
package-dir, and this package adds the checkout's root to its own search path, so
`PYTHONPATH=<checkout>` alone (the tests' child processes, torchrun workers) imports the same tree
as an editable install.
"""

from __future__ import annotations

from pathlib import Path

ROOMS = ("collectors", "attribution", "controller", "rules")


def _checkout_root() -> Path | None:
    """The source checkout this package sits in (rooms beside it, a pyproject.toml), else None (a
    wheel).
    """
    here = Path(__file__).resolve().parent
    root = here.parent
    if (here / "collectors").is_dir():  # installed: the rooms are inside this package
        return None
    if (root / "pyproject.toml").is_file() and all((root / room).is_dir() for room in ROOMS):
        return root
    return None


_root = _checkout_root()
if _root is not None and str(_root) not in __path__:
    __path__.append(str(_root))

