"""A rank stopped in the attempt's first evaluation or first save (issue 33): time to a decision and
the culprit, under `faultlens run` on a user's own DDP script
(tests/torch_jobs/user_scripts/ddp_eval_save.py: eval with an all_reduce of its metric, a save
with a barrier; gloo, 2 simulated nodes x 2 ranks), and the slow-save look-alikes that must stay
quiet; each also beside a CPU hog (one busy process per core).

- hangs: {eval, save} x {asleep, a read of a pipe nobody writes, a lock another thread holds}; the
  job runs one attempt (--max-attempts 1): the decision is what is measured;
- look-alikes: a rank's first save slow (15 s) but working: serialising (cpu) or writing to a slow
  disk (io); the job must finish with no incident.

The hang floor is passed in (4 s, as the tests do); the untimed-phase allowance is the shipped
600 s, which is what a hang in a first slow phase waited for before (or gloo's own timeout).

    PYTHONPATH=. python -m bench.bench_first_phase_hang [--no-write] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_campaign import commit  # noqa: E402
from bench.common import Figure, Section, emit, machine, write_section  # noqa: E402

SCRIPT = REPO / "tests" / "torch_jobs" / "user_scripts" / "ddp_eval_save.py"
SHORT = {"STEPS": "12", "EVAL_EVERY": "6", "SAVE_EVERY": "6", "TIMEOUT": "300"}
HANGS = [  # where, how, rank
    ("eval", "sleep", 2),
    ("eval", "read", 1),
    ("eval", "lock", 3),
    ("save", "sleep", 0),
    ("save", "read", 2),
    ("save", "lock", 1),
]
LOOKALIKES = ["cpu", "io"]
WITH_HOG = {("eval", "sleep"), ("save", "lock"), "cpu", "io"}


@contextlib.contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    procs = []
    if on:
        for _ in range(os.cpu_count() or 2):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def thresholds(path: Path) -> Path:
    text = (REPO / "rules" / "thresholds.yaml").read_text()
    path.write_text(text.replace("\n  floor_s: 10.0\n", "\n  floor_s: 4.0\n", 1))
    return path


def run(work: Path, job: str, env: dict[str, str], max_attempts: int | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "faultlens.controller.cli.main", "run", "--store",
            str(work / "store"), "--workdir", str(work / "run"), "--nnodes", "2",
            "--nproc-per-node", "2", "--job", job, "--thresholds",
            str(thresholds(work / "thresholds.yaml"))]
    if max_attempts:
        argv += ["--max-attempts", str(max_attempts)]
    full_env = {**os.environ, **SHORT, **env, "CKPT_DIR": str(work / "ckpt"),
                "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    started = time.monotonic()
    proc = subprocess.run([*argv, "--", str(SCRIPT)], cwd=work, env=full_env, capture_output=True,
                          text=True, timeout=900)
    wall = time.monotonic() - started
    from faultlens.attribution.reading.store import Store

    result: dict[str, Any] = {"rc": proc.returncode, "wall_s": round(wall, 1),
                              "completed": "training completed" in proc.stdout + proc.stderr}
    with Store(work / "store") as store:
        incidents = store.query(
            "SELECT class, rule, culprit_ranks, first_signal_ts, detected_ts FROM incidents "
            "WHERE job_id = ?", [job]).to_pylist()
        made = store.query(
            "SELECT action, min(ts) AS t FROM decisions WHERE job_id = ? GROUP BY decision_id, "
            "action ORDER BY t", [job]).to_pylist()
    result["incidents"] = [(i["class"], i["rule"], list(i["culprit_ranks"] or []))
                           for i in incidents]
    result["decisions"] = [d["action"] for d in made]
    if incidents and made:
        since = incidents[0]["first_signal_ts"]  # the last step any rank completed
        result["last_step_to_decision_s"] = round((made[0]["t"] - since).total_seconds(), 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print, do not write the section")
    parser.add_argument("--quick", action="store_true", help="no CPU-hog runs")
    args = parser.parse_args()
    rev, started = commit(), dt.datetime.now(dt.UTC)
    rows: list[dict[str, Any]] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases: list[tuple[str, dict[str, str], bool, int | None, str]] = []
        for where, how, rank in HANGS:
            env = {"HANG_RANK": str(rank), "HANG_IN": where, "HANG_HOW": how}
            for hog in (False, True):
                if hog and ((where, how) not in WITH_HOG or args.quick):
                    continue
                cases.append((f"{where} {how} rank {rank}", env, hog, 1, f"rank {rank}"))
        for how in LOOKALIKES:
            env = {"SLOW_SAVE_RANK": "2", "SLOW_SAVE_S": "15", "SLOW_SAVE_HOW": how}
            for hog in (False, True):
                if hog and (how not in WITH_HOG or args.quick):
                    continue
                cases.append((f"slow save ({how}) rank 2", env, hog, None, "quiet"))
        for index, (name, env, hog, attempts, want) in enumerate(cases):
            work = root / f"case{index}"
            work.mkdir()
            with cpu_hog(hog):
                result = run(work, f"case{index}", env, attempts)
                loads.append(os.getloadavg()[0])
            culprits = [r for _, _, ranks in result["incidents"] for r in ranks]
            got = (f"rank {culprits[0]}" if len(culprits) == 1 else
                   "quiet" if not result["incidents"] and result["completed"] else
                   str(result["incidents"]))
            row = {"case": name, "hog": hog, "want": want, "got": got, **result}
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    load = max(loads) if loads else os.getloadavg()[0]
    emit("first_phase_hang", {"commit": rev, "machine": machine(), "load_avg_1m_max": load,
                              "rows": rows})
    date = started.strftime("%Y-%m-%d %H:%M")
    short = rev.split(" ")[0]
    figures = []
    for row in rows:
        label = f"{row['case']}{' + CPU hog' if row['hog'] else ''}"
        if row["want"] == "quiet":
            value = ("quiet, finished" if row["got"] == "quiet"
                     else f"{row['got']} ({', '.join(row['decisions'])})")
            figures.append(Figure(label, value, "quiet, finished", "-", "-", short, date))
        else:
            decided = row.get("last_step_to_decision_s")
            value = (f"{row['got']}, {', '.join(row['decisions']) or 'no decision'}, "
                     f"{decided} s after the last step" if decided is not None else row["got"])
            figures.append(Figure(label, value, f"{row['want']}, failover", "600 s allowance",
                                  f"{600 / decided:.0f}x" if decided else "-", short, date))
    right = sum(1 for r in rows if r["got"] == r["want"])
    figures.append(Figure("right (culprit named, look-alikes quiet)", f"{right}/{len(rows)}",
                          f"{len(rows)}/{len(rows)}", "-", "-", short, date))
    section = Section(
        "A rank stopped in its first eval or save (faultlens run, user script)",
        "Time from the last completed step to the decision, and the culprit, when one rank stops "
        "in the attempt's first evaluation or save while its peers block in the collective after "
        "it; slow saves that keep working must stay quiet. Anchor: the 600 s untimed-phase "
        "allowance these hangs waited for before (ratio: allowance over the measured time).",
        ("PYTHONPATH=. python -m bench.bench_first_phase_hang",),
        tuple(figures),
        (
            f"2 simulated nodes x 2 ranks, gloo on CPU, hang floor 4 s passed in; the highest load "
            f"average seen was {load:.1f} on {machine().get('cores', '?')} CPUs (a shared machine, "
            "everything at nice 19, the CPU hog too).",
            "Hangs run one attempt (--max-attempts 1): the decision is the figure; look-alikes "
            "run to the end.",
        ),
    )
    if not args.no_write:
        write_section(REPO / "docs" / "benchmarks.md", section)


if __name__ == "__main__":
    main()
