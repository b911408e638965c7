"""faultlens/compiled.py: kernels defined after use_compiled() (a module imported after the switch,
as a bench's or a caller's warm-up does) are compiled at their first call, and a kernel calling
another through its module's global is typed (it failed: numba found the Kernel object)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_MODULE = """
import numpy as np
from faultlens.compiled import kernel

@kernel(cache=False, nogil=True)
def inner(a, i):
    return a[i] * np.int64(3)

@kernel(cache=False, nogil=True)
def outer(a):
    total = np.int64(0)
    for i in range(a.shape[0]):
        total += inner(a, i)
    return total
"""

_CHILD = """
import sys
import numpy as np
from faultlens.compiled import is_compiled, use_compiled
use_compiled()
sys.path.insert(0, sys.argv[1])
import late_kernels
assert is_compiled()
print(late_kernels.outer(np.arange(10, dtype=np.int64)), late_kernels.inner(np.arange(3), 2))
print(*(type(f).__module__.split(".")[0] for f in (late_kernels.inner, late_kernels.outer)))
"""


def test_a_kernel_defined_after_use_compiled_calls_another(tmp_path: Path) -> None:
    (tmp_path / "late_kernels.py").write_text(textwrap.dedent(_MODULE))
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert lines[0] == "135 6"
    # the module's globals are numba's dispatchers now
    assert lines[1] == "numba numba"
