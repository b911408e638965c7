"""bench/telemetry_volume.py runs (small), its bytes per row come from real segments, and it scales
honestly.
"""

from __future__ import annotations

import pytest

from bench.telemetry_volume import main


def test_volume_bench_measures_real_segments_and_scales(tmp_path, capsys):
    result = main(
        [
            "--gpus",
            "1024",
            "--sample-seconds",
            "30",
            "--steps",
            "12",
            "--events-per-gpu-hour",
            "0.25",
            "--json",
            str(tmp_path / "volume.json"),
        ]
    )
    measured = result["measured"]
    samples = measured["gpu_samples"]
    # one segment per node per 5 s
    assert samples["rows"] == 4 * 8 * 30 and samples["rows_per_segment"] == 40
    # small segments pay Parquet's per-file overhead; compaction removes it
    assert samples["bytes_per_row_written"] > 5 * samples["bytes_per_row_compacted"] > 0
    assert (
        measured["steps"]["rows_per_segment"] == 1
        and measured["steps_batched"]["rows_per_segment"] == 12
    )
    scaled = {(r["table"], r["basis"]): r for r in result["at_scale"]}
    gpu = next(r for (t, _), r in scaled.items() if t == "gpu_samples")
    assert gpu["rows_per_s"] == 1024 and gpu["segments_per_s"] == pytest.approx(128 / 5)
    assert gpu["mb_per_s_written"] == pytest.approx(1024 * samples["bytes_per_row_written"] / 1e6)
    dump = next(r for (t, _), r in scaled.items() if t == "collectives")
    assert dump["rows_per_event"] == 1024 * 2000
    assert (tmp_path / "volume.json").stat().st_size > 0
    assert "| gpu_samples |" in capsys.readouterr().out
