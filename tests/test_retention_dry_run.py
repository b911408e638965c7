"""`faultlens retention --dry-run` lists what it would delete and deletes nothing; without it, the
same list goes.
"""

from __future__ import annotations

import datetime as dt

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main


def _count(store) -> int:
    with Store(str(store)) as reader:
        return reader.query("SELECT count(*) AS n FROM gpu_events").to_pylist()[0]["n"]


def test_dry_run_deletes_nothing_then_the_real_run_deletes_the_same(store_dir, capsys):
    today = dt.datetime.now(dt.UTC)
    with SegmentSink(store_dir) as sink:
        for days in (0, 5, 40, 41, 400):
            sink.write(
                "gpu_events",
                [
                    {
                        "ts": today - dt.timedelta(days=days),
                        "node": f"node-{days % 3}",
                        "kind": "xid",
                        "code": 79,
                    }
                ],
            )
    assert main(["retention", "--store", str(store_dir), "--days", "30", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "would remove 3 partitions older than 30 days (dry run: nothing deleted)" in dry
    assert _count(store_dir) == 5
    listed = sorted(
        line.split(" would remove ")[1]
        for line in dry.splitlines()
        if " would remove " in line and line.startswith("gpu_events")
    )
    assert main(["retention", "--store", str(store_dir), "--days", "30"]) == 0
    real = capsys.readouterr().out
    assert (
        sorted(
            line.split(" removed ")[1]
            for line in real.splitlines()
            if line.startswith("gpu_events")
        )
        == listed
    )
    assert _count(store_dir) == 2
