"""Two real writers and a real compactor on one partition, SIGKILL at random moments and right
after a compacted segment lands beside its originals (issue 37): every acknowledged row is read
exactly once, as left and after a recovery compaction. bench/bench_store_kill9.py runs 60 trials."""

from __future__ import annotations

import random
from pathlib import Path

from bench.bench_store_kill9 import trial


class _Forced(random.Random):
    """The bench's own random choices, with the compactor's mode fixed."""

    def __init__(self, seed: int, mode: str) -> None:
        super().__init__(seed)
        self.mode = mode

    def choice(self, seq):
        if "between" in seq:
            return self.mode
        return super().choice(seq)


def test_kill9_between_a_compacted_write_and_its_deletes(tmp_path: Path) -> None:
    result = trial(tmp_path, _Forced(3, "between"))
    assert result.compacted_beside_originals  # the moment the issue names was reached
    assert result.acked > 0
    assert (result.lost, result.duplicated) == (0, 0)
    assert (result.lost_after_recovery, result.duplicated_after_recovery) == (0, 0)


def test_kill9_at_a_random_moment(tmp_path: Path) -> None:
    result = trial(tmp_path, _Forced(4, "random"))
    assert result.acked > 0
    assert (result.lost, result.duplicated) == (0, 0)
    assert (result.lost_after_recovery, result.duplicated_after_recovery) == (0, 0)
