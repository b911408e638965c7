"""The two pickle readers (compiled scanner, restricted unpickler) accept and refuse exactly the
same dumps, and a small seed set of the fuzz bench (bench/bench_fr_fuzz.py) finds no crash,
traceback or disagreement. Both run in
subprocesses: a scanner regression that segfaults fails the test instead of killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import DATA_DIR

REPO = Path(__file__).resolve().parents[1]

_DIFFERENTIAL = textwrap.dedent("""
    import json, random, sys
    from pathlib import Path
    from faultlens.collectors.artifacts.flight_recorder import read_dump_dir

    seeds = [p.read_bytes() for p in sorted(Path(sys.argv[1]).glob("_dump_*"))]
    out = Path(sys.argv[2])
    out.mkdir()
    rng = random.Random(16)
    for i in range(int(sys.argv[3])):
        data = bytearray(rng.choice(seeds))
        data[rng.randrange(len(data))] = rng.randrange(256)
        (out / f"_dump_{i}").write_bytes(bytes(data))

    def outcome(fast):
        dumps = read_dump_dir(out, fast_path=fast, columns=None)
        rows = {}
        for row in dumps.table.to_pylist():
            rows.setdefault(row["dump_id"].rsplit("/", 1)[-1], []).append(
                {k: v for k, v in row.items() if k != "pg_ranks"})
        errors = {e.path.rsplit("/", 1)[-1] for e in dumps.errors}
        return rows, errors

    fast_rows, fast_errors = outcome(True)
    ref_rows, ref_errors = outcome(False)
    names = set(fast_rows) | set(ref_rows) | fast_errors | ref_errors
    disagree = sorted(n for n in names if (n in fast_errors) != (n in ref_errors)
                      or fast_rows.get(n) != ref_rows.get(n))
    print(json.dumps({"files": len(names), "refused": len(ref_errors), "disagree": disagree[:20],
                      "disagreements": len(disagree)}))
""")


def test_scanner_and_restricted_unpickler_agree_on_one_byte_mutants_of_real_dumps(
    tmp_path: Path,
) -> None:
    """175 of 2,000 one-byte mutants of a real dump were refused by one reader and read (with
    replacement characters) by the other: whether a corrupt dump was refused depended on the set's
    size."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _DIFFERENTIAL,
            str(DATA_DIR / "nccl-fr-gpu_error_2nd"),
            str(tmp_path / "mutants"),
            "1200",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["files"] == 1200
    assert 0 < result["refused"] < 1200  # the mutants are a mix of readable and broken dumps
    assert result["disagreements"] == 0, result["disagree"]


def test_fuzz_seed_set_finds_no_crash_traceback_or_disagreement() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_fr_fuzz", "--n", "500", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["reader"]: r for r in json.loads(proc.stdout)}
    for reader in ("pickle", "json"):
        r = results[reader]
        assert r["inputs"] == 500, r
        assert r.get("worker_failed") is None and not r.get("timed_out"), r
        assert (r["crashes"], r["tracebacks"], r["disagreements"]) == (0, 0, 0), r["examples"]
        assert r["accepted"] > 0 and r["refused"] > 0
