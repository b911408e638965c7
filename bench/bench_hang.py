"""Hang analysis at scale, side by side with torch's own analyzer, and dump ingest rate beside
pickle.load.

    python bench/bench_hang.py                       # 1,024 ranks (default)
    python bench/bench_hang.py --ranks 1024,4096,16384 --entries 2000 --torch-max-ranks 1024

Synthetic dump sets (cached under --cache, default bench/out/fr-dumps, git-ignored): a Megatron-like
job with tensor (8), pipeline (4) and data parallel groups plus the default group, 2,000 entries per
rank (pickle protocol 2, NCCL format 2.10, two stack frames per entry, ~230 bytes an entry), written
as `_dump_<rank>`. A hang is injected: one rank stops before a tensor-parallel all_reduce; its TP
peers enter it and wait, its DP peers wait in their next data-parallel all_reduce, every other rank
waits one step later (follow-ons in every group).

Measured, each in its own subprocess (wall time, peak RSS from wait4):
- faultlens: reading + analysis as `faultlens analyze-hang DIR` does them (`analyze_dump_dir`: the
  analysis' first pass runs on the rows as they are read), in a process importing only that (and the
  CLI itself at the smallest size); the culprit it reports is checked;
- torch: `python -m torch.distributed.flight_recorder.fr_trace DIR -p _dump_` where it can finish
  (at most --torch-max-ranks ranks; at 1,024 it needs ~4 GB and ~90 s here, and cannot reach 16,384
  in memory);
- ingest rate at the smallest size: faultlens' reader building the full collectives table, beside
  plain pickle.load of every dump into Python objects, and the naive path (restricted unpickler +
  row dicts + Arrow table, on the first --naive-ranks dumps, reported per dump).
Prints a JSON document and a markdown table. Mind the machine: the sizes run one after another.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.common import Figure, Section, emit, machine, write_section  # noqa: E402

DEFAULT_CACHE = REPO_ROOT / "bench" / "out" / "fr-dumps"
TP, PP = 8, 4
T0 = 1_790_000_000_000_000_000
FORMAT = "2"  # bump when the generator changes: old caches are regenerated


# --------------------------------------------------------------------------------------------------
# synthetic job


def _layout(world: int) -> dict[str, object]:
    tp = min(TP, world)
    pp = PP if world >= tp * PP else 1
    dp = world // (tp * pp)
    if tp * pp * dp != world:
        raise SystemExit(f"--ranks {world}: must be a multiple of {tp * pp}")
    return {"tp": tp, "pp": pp, "dp": dp}


def _groups_of(rank: int, world: int) -> dict[str, tuple[str, str, list[int]]]:
    """kind -> (name, desc, ranks) for the groups `rank` is in (Megatron order: tp fastest, then dp,
    then pp).
    """
    lay = _layout(world)
    tp, dp, pp = lay["tp"], lay["dp"], lay["pp"]
    stage, rest = divmod(rank, tp * dp)
    d, t = divmod(rest, tp)
    tp_ranks = [stage * tp * dp + d * tp + i for i in range(tp)]
    dp_ranks = [stage * tp * dp + j * tp + t for j in range(dp)]
    pp_ranks = [s * tp * dp + d * tp + t for s in range(pp)]
    n_tp = pp * dp
    return {
        "world": ("0", "default_pg", list(range(world))),
        "tp": (str(1 + stage * dp + d), "TENSOR_MODEL_PARALLEL_GROUP", tp_ranks),
        "dp": (str(1 + n_tp + stage * tp + t), "DATA_PARALLEL_GROUP", dp_ranks),
        "pp": (str(1 + n_tp + pp * tp + d * tp + t), "PIPELINE_MODEL_PARALLEL_GROUP", pp_ranks),
    }


# per step: (kind, op, input sizes, output sizes)
_STEP = (
    ("tp", "nccl:_all_gather_base", [[2048, 1, 5120]], [[16384, 1, 5120]]),
    ("tp", "nccl:_reduce_scatter_base", [[16384, 1, 5120]], [[2048, 1, 5120]]),
    ("tp", "nccl:all_reduce", [[2048, 5120]], [[2048, 5120]]),
    ("tp", "nccl:_all_gather_base", [[2048, 5120]], [[16384, 5120]]),
    ("tp", "nccl:_reduce_scatter_base", [[16384, 5120]], [[2048, 5120]]),
    ("pp", "nccl:all_reduce", [[1]], [[1]]),
    ("tp", "nccl:all_reduce", [[2048, 5120]], [[2048, 5120]]),
    ("dp", "nccl:all_reduce", [[52428800]], [[52428800]]),
    ("world", "nccl:all_reduce", [[4]], [[4]]),
)
_FAULT_INDEX = 2  # the culprit stops before its step's third op (a TP all_reduce)


def _culprit(world: int) -> int:
    return world // 3 + 5


def make_dump(rank: int, world: int, entries: int) -> dict:
    """One rank's dump dict (shared string objects, so the pickler memoizes them like torch's does).
    """
    groups = _groups_of(rank, world)
    culprit = _culprit(world)
    fault_step = -(-entries // len(_STEP))  # enough steps that every rank's ring buffer is full
    culprit_groups = _groups_of(culprit, world)
    # how far this rank gets: (step, index) of the first op it does NOT enter synchronous semantics:
    # a rank waits in the first op whose group holds a rank that never gets there
    if rank == culprit:
        stop = (fault_step, _FAULT_INDEX)
    elif rank in culprit_groups["tp"][2]:
        stop = (fault_step, _FAULT_INDEX + 1)  # entered the TP all_reduce the culprit never joins
    elif rank in culprit_groups["pp"][2]:
        stop = (fault_step, 6)  # waits in the pipeline all_reduce
    elif rank in culprit_groups["dp"][2]:
        stop = (fault_step, 8)  # waits in the data-parallel all_reduce
    else:
        stop = (fault_step, 9)  # waits in the world all_reduce (follow-on)
    seq = {kind: 0 for kind in groups}
    local_id = {"world": 0, "tp": 1, "dp": 2, "pp": 3}
    records = []
    frame_a = {
        "name": "all_reduce",
        "filename": "/usr/lib/python3/torch/distributed/distributed_c10d.py",
        "line": 3245,
    }
    frames_b = [
        {
            "name": "forward",
            "filename": "/workspace/megatron/core/transformer/layer.py",
            "line": 300 + i,
        }
        for i in range(len(_STEP))
    ]
    dtype = ["BFloat16"]
    total_steps = fault_step + 1
    record_id = 0
    for step in range(total_steps):
        for index, (kind, op, in_sizes, out_sizes) in enumerate(_STEP):
            if (step, index) >= stop:
                break
            seq[kind] += 1
            name, desc, _ = groups[kind]
            incomplete = (step, index) >= (stop[0], stop[1] - 1) and step >= fault_step
            t = T0 + (step * len(_STEP) + index) * 1_000_000 + rank
            records.append(
                {
                    "record_id": record_id,
                    "pg_id": local_id[kind],
                    "process_group": (name, desc),
                    "thread_name": "pt_autograd_0",
                    "thread_id": "140000000000001",
                    "collective_seq_id": seq[kind],
                    "p2p_seq_id": 0,
                    "op_id": seq[kind],
                    "profiling_name": op,
                    "time_created_ns": t,
                    # fresh lists per entry: torch's pickler memoizes strings, not lists
                    "input_sizes": [list(x) for x in in_sizes],
                    "input_dtypes": list(dtype),
                    "output_sizes": [list(x) for x in out_sizes],
                    "output_dtypes": list(dtype),
                    "state": "scheduled" if incomplete else "completed",
                    "time_discovered_started_ns": None if incomplete else t + 10_000,
                    "time_discovered_completed_ns": None if incomplete else t + 90_000,
                    "retired": not incomplete,
                    "timeout_ms": 600_000,
                    "is_p2p": False,
                    "frames": [dict(frame_a), dict(frames_b[index])],
                }
            )
            record_id += 1
        else:
            continue
        break
    records = records[-entries:]  # the ring buffer keeps the last `entries`
    config = {
        name: {"name": name, "desc": desc, "ranks": str(ranks)}
        for name, desc, ranks in groups.values()
    }
    status = {}
    for kind, (name, _, _) in groups.items():
        mine = [r for r in records if r["process_group"][0] == name]
        if mine:
            done = [r["collective_seq_id"] for r in mine if r["retired"]]
            status[str(local_id[kind])] = {
                "last_enqueued_collective": mine[-1]["collective_seq_id"],
                "last_started_collective": -1,
                "last_completed_collective": max(done) if done else -1,
            }
    return {"version": "2.10", "pg_config": config, "pg_status": status, "nccl_version": "2.27.3",
            "entries": records}


def _write_one(args: tuple[str, int, int, int]) -> int:
    directory, rank, world, entries = args
    path = Path(directory) / f"_dump_{rank}"
    data = pickle.dumps(make_dump(rank, world, entries), protocol=2)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)
    return len(data)


def ensure_set(cache: Path, world: int, entries: int, workers: int) -> tuple[Path, float]:
    directory = cache / f"ranks{world}-entries{entries}-v{FORMAT}"
    marker = directory / "COMPLETE"
    if marker.exists():
        return directory, 0.0
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    todo = [
        (str(directory), r, world, entries)
        for r in range(world)
        if not (directory / f"_dump_{r}").exists()
    ]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(_write_one, todo, chunksize=32):
            pass
    marker.write_text(json.dumps({"ranks": world, "entries": entries, "culprit": _culprit(world)}))
    return directory, time.perf_counter() - started


# --------------------------------------------------------------------------------------------------
# measuring


def _measure(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT
) -> dict[str, object]:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=env or os.environ.copy())
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"seconds": round(time.perf_counter() - started, 2), "timed_out": True}
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "seconds": round(seconds, 2),
        "exit_code": proc.returncode,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
        "children_maxrss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def _run_with_rss(cmd: list[str], timeout: float, tree: Path = REPO_ROOT) -> dict[str, object]:
    """Run `cmd` in a wrapper that reports the child's own peak RSS (wait4), so sizes do not mix."""
    wrapper = ("import os,sys,time,json,subprocess\n"
               "t=time.perf_counter(); p=subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, "
               "stderr=subprocess.PIPE)\n"
               "out,err=p.communicate(); _,status,ru=os.wait4(p.pid,0) if p.returncode is None "
               "else (0,0,None)\n"
               "import resource; ru=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
               "sys.stdout.write(json.dumps({'seconds':time.perf_counter()-t,'rc':p.returncode,"
               "'cpu':ru.ru_utime+ru.ru_stime,"
               "'maxrss_mb':ru.ru_maxrss/1024,'out':out.decode(errors='replace')[-4000000:],"
               "'err':err.decode(errors='replace')[-4000:]}))\n")
    env = os.environ | {"PYTHONPATH": str(tree)}  # `tree`'s faultlens (the code before: --before)
    result = _measure([sys.executable, "-c", wrapper, *cmd], timeout, env, tree)
    if result.get("timed_out"):
        return result
    try:
        inner = json.loads(result["stdout"])
    except (ValueError, TypeError):
        return {"error": str(result.get("stderr"))[-2000:]}
    return {
        "seconds": round(inner["seconds"], 2),
        "cpu_seconds": round(inner["cpu"], 2),
        "exit_code": inner["rc"],
        "peak_rss_mb": round(inner["maxrss_mb"]),
        "stdout": inner["out"],
        "stderr": inner["err"],
    }


# the small set is read with the compiled scanner and analysed by the compiled kernels on purpose
# (by default a small set skips both)
_WARM_RUN = """
import sys
from faultlens.compiled import use_compiled
use_compiled()
from faultlens.attribution.detectors.hang import analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.controller.hang_dump_dir import analyze_dump_dir

analyze_collectives(read_dump_dir(sys.argv[1], fast_path=True).table)
# the dictionary read analyze-hang makes (its narrow index and int32 kernels' specializations)
analyze_dump_dir(sys.argv[1])
"""

_LIBRARY_RUN = """
import json, resource, sys, threading, time
t = time.perf_counter()
# where the memory goes: resident MiB (sampled every 10 ms, the peak so far) and CPU at each phase
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
peak, phases = [0.0], []
def sample():
    while True:
        peak[0] = max(peak[0], rss())
        time.sleep(0.01)
threading.Thread(target=sample, daemon=True).start()
def mark(name):
    ru = resource.getrusage(resource.RUSAGE_SELF)
    now = rss()
    peak[0] = max(peak[0], now)
    phases.append({"phase": name, "rss_mib": round(now), "peak_mib": round(peak[0]),
                   "cpu_s": round(ru.ru_utime + ru.ru_stime, 2)})
import numpy, pyarrow
mark("python, numpy, pyarrow imported")
from faultlens.controller.hang_dump_dir import analyze_dump_dir
from faultlens.collectors.artifacts.flight_recorder import assembly
from faultlens.attribution.detectors.hang import analyze, stream
mark("faultlens imported")
flush, take, table = assembly.Assembly.flush_chunk, stream.PassOneStream.take, \
    assembly.Assembly.table
def flushed(self, identity):
    flush(self, identity)
    if len(self.chunks) == 1:
        mark("first chunk built (reader kernels loaded)")
def whole(self, identity):
    mark("every dump read")
    return table(self, identity)
def taken(self, tab):
    mark("table built")
    out = take(self, tab)
    mark("pass 1 done")
    return out
assembly.Assembly.flush_chunk, assembly.Assembly.table = flushed, whole
stream.PassOneStream.take = taken
# as analyze-hang: pass 1 on the rows as they are read
dumps, report = analyze_dump_dir(sys.argv[1])
mark("analysis done")
seconds = time.perf_counter() - t
read = {"read_seconds": dumps.seconds, "seconds": seconds, "rows": dumps.table.num_rows,
        "table_mib": round(dumps.table.nbytes / 2**20, 1),
        "table_bytes_per_row": round(dumps.table.nbytes / max(dumps.table.num_rows, 1), 1)}
print(json.dumps(report.to_dict() | {"dumps": read, "phases": phases}))
"""


def warm_cache(directory: Path) -> float:
    """Read every dump once so each timed run starts from the page cache (a 16,384-rank set is ~9
    GB: reading it from disk would measure the disk)."""
    started = time.perf_counter()
    for path in directory.glob("_dump_*"):
        with open(path, "rb") as handle:
            while handle.read(1 << 22):
                pass
    return time.perf_counter() - started


def bench_before(directory: Path, world: int, timeout: float, tree: Path) -> dict[str, object]:
    """The library call of bench_faultlens on the code in `tree` (an export of an earlier commit),
    after one untimed run that compiles its kernels into its own cache."""
    cmd = [sys.executable, "-c", _LIBRARY_RUN, str(directory)]
    _run_with_rss(cmd, timeout, tree)
    result = _run_with_rss(cmd, timeout, tree)
    out = {key: result.get(key) for key in ("seconds", "cpu_seconds", "peak_rss_mb", "exit_code")}
    try:
        report = json.loads(result["stdout"])
        out["correct"] = report["culprit_ranks"] == [_culprit(world)]
        out["table_mib"] = report["dumps"].get("table_mib")
        out["phases"] = report.get("phases")
    except (ValueError, KeyError, TypeError):
        out["error"] = (result.get("stderr") or "")[-1500:]
    return out


def bench_faultlens(directory: Path, world: int, timeout: float, cli: bool) -> dict[str, object]:
    """Reading + analysis in a fresh process: the library call analyze-hang makes (analyze_dump_dir;
    imports of faultlens' reader and analysis only), and, when `cli`, the `faultlens analyze-hang
    --json` command (which also imports every other command module of the CLI)."""
    library_cmd = [sys.executable, "-c", _LIBRARY_RUN, str(directory)]
    cli_cmd = [
        sys.executable,
        "-m",
        "faultlens.controller.cli.main",
        "analyze-hang",
        str(directory),
        "--json",
    ]
    # compile the numba kernels once into their on-disk cache (a one-time cost per install, reported
    # separately): the small real NCCL set exercises every kernel the big run uses
    warm = _run_with_rss(
        [
            sys.executable,
            "-c",
            _WARM_RUN,
            str(REPO_ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"),
        ],
        600,
    )
    if world <= 1024:
        # the kernels' specializations a set of this shape uses (int16 dictionary indices where a
        # column has over 127 values: the real set has none) compiled once, untimed; larger sets
        # of this generator use the same ones
        _run_with_rss(library_cmd, timeout)
    result = _run_with_rss(library_cmd, timeout)
    out: dict[str, object] = {
        "seconds": result.get("seconds"),
        "cpu_seconds": result.get("cpu_seconds"),
        "peak_rss_mb": result.get("peak_rss_mb"),
        "exit_code": result.get("exit_code"),
        "compile_warmup_s": warm.get("seconds"),
    }
    if cli:
        cli_result = _run_with_rss(cli_cmd, timeout)
        out["cli"] = {
            key: cli_result.get(key)
            for key in ("seconds", "cpu_seconds", "peak_rss_mb", "exit_code")
        }
    if result.get("timed_out"):
        out["timed_out"] = True
        return out
    try:
        report = json.loads(result["stdout"])
        out["culprit_ranks"] = report["culprit_ranks"]
        out["verdict"] = report["verdict"]
        out["correct"] = report["culprit_ranks"] == [_culprit(world)]
        out["read_seconds"] = round(report["dumps"]["read_seconds"], 2)
        out["in_process_seconds"] = round(report["dumps"]["seconds"], 2)
        out["table_mib"] = report["dumps"]["table_mib"]
        out["table_bytes_per_row"] = report["dumps"]["table_bytes_per_row"]
        out["phases"] = report["phases"]
    except (ValueError, KeyError, TypeError):
        out["error"] = (result.get("stderr") or "")[-1500:]
    return out


def bench_torch(directory: Path, world: int, timeout: float) -> dict[str, object]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.flight_recorder.fr_trace",
        str(directory),
        "-p",
        "_dump_",
    ]
    result = _run_with_rss(cmd, timeout)
    if result.get("timed_out"):
        return {"seconds": result["seconds"], "timed_out": True}
    text = (result.get("stdout") or "") + (result.get("stderr") or "")
    culprit = str(_culprit(world))
    return {"seconds": result.get("seconds"), "cpu_seconds": result.get("cpu_seconds"),
            "peak_rss_mb": result.get("peak_rss_mb"), "exit_code": result.get("exit_code"),
            "mentions_culprit": culprit in text, "output_lines": text.count("\n"),
            "tail": text.strip().splitlines()[-3:] if text.strip() else []}


def bench_ingest(directory: Path, world: int, naive_ranks: int) -> dict[str, object]:
    sys.path.insert(0, str(REPO_ROOT))
    from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
    from faultlens.collectors.artifacts.safe_pickle import safe_load
    from faultlens.collectors.store.schema import rows_to_table

    files = sorted(directory.glob("_dump_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    started = time.perf_counter()
    table = read_dump_dir(directory).table
    faultlens_s = time.perf_counter() - started
    rows = table.num_rows
    del table
    # the baselines run with the garbage collector off, as torch's own loader does (with it on,
    # pickle.load of 1,024 dumps is several times slower still)
    gc.disable()
    started = time.perf_counter()
    loaded = 0
    for path in files:
        with open(path, "rb") as handle:
            # our own synthetic files: the unsafe baseline
            loaded += len(pickle.load(handle)["entries"])
    pickle_s = time.perf_counter() - started
    naive = files[:naive_ranks]
    started = time.perf_counter()
    naive_rows = []
    for path in naive:
        dump = safe_load(path)
        rank = int(path.name.rsplit("_", 1)[1])
        for e in dump["entries"]:
            name, desc = e["process_group"]
            naive_rows.append(
                {
                    "ts": e["time_created_ns"],
                    "rank": rank,
                    "dump_id": path.name,
                    "fr_version": dump["version"],
                    "pg_id": str(e["pg_id"]),
                    "pg_name": name,
                    "pg_desc": desc,
                    "record_id": e["record_id"],
                    "collective_seq_id": e["collective_seq_id"],
                    "p2p_seq_id": e["p2p_seq_id"],
                    "op_id": e["op_id"],
                    "op": e["profiling_name"],
                    "state": e["state"],
                    "is_p2p": e["is_p2p"],
                    "retired": e["retired"],
                    "time_created": e["time_created_ns"],
                    "time_started": e["time_discovered_started_ns"],
                    "time_completed": e["time_discovered_completed_ns"],
                    "input_sizes": e["input_sizes"],
                    "input_dtypes": e["input_dtypes"],
                    "output_sizes": e["output_sizes"],
                    "output_dtypes": e["output_dtypes"],
                    "timeout_ms": e["timeout_ms"],
                    "frames": [
                        f"{f['name']} ({f['filename']}:{f['line']})" for f in e.get("frames", [])
                    ],
                }
            )
    for row in naive_rows:
        for key in ("ts", "time_created", "time_started", "time_completed"):
            if row[key] is not None:
                row[key] = dt.datetime.fromtimestamp(row[key] / 1e9, dt.UTC)
    rows_to_table("collectives", naive_rows)
    naive_s = time.perf_counter() - started
    gc.enable()
    per_dump_naive = naive_s / max(len(naive), 1)
    return {
        "ranks": world,
        "rows": rows,
        "faultlens_reader_s": round(faultlens_s, 2),
        "faultlens_dumps_per_s": round(world / faultlens_s, 1),
        "pickle_load_s": round(pickle_s, 2),
        "pickle_load_dumps_per_s": round(world / pickle_s, 1),
        "naive_rows_dumps_measured": len(naive),
        "naive_rows_dumps_per_s": round(1 / per_dump_naive, 1),
        "naive_rows_projected_s": round(per_dump_naive * world, 1),
        "speedup_vs_pickle_load": round(pickle_s / faultlens_s, 1),
        "speedup_vs_naive": round(per_dump_naive * world / faultlens_s, 1),
        "entries_loaded_by_pickle": loaded,
    }


# --------------------------------------------------------------------------------------------------
# the published section (--write)

MEMORY_TITLE = "Hang analysis memory and reading at scale: RSS by phase"
_NOT_16384 = (
    "16,384 ranks: not measured in this run (its 7.5 GB set could not be generated and read "
    "under load 60-100 in the time this stop had). The previous figures (4bb9040, load 22-43): "
    "74.85 s CPU, 2,249 MiB peak; the seq-id check since added would have cost ~2.6 GB more "
    "there, and now costs a slice's scratch unless a set has a candidate."
)
#: what the rows cannot say (measured beside this run; see the section's figures for the run)
NOTES = (
    "The code before (3b4dccc), the same library call on the same 1,024-rank set, measured alone "
    "at the start of this stop (load 28.7): 7.38 s CPU, 585 MiB peak, reached after the read: "
    "the cross-rank seq-id check (seq_consistency.py, added after the previous figures) made "
    "int64 copies of its columns, ~80 bytes a row (+160 MiB here; ~2.6 GB at 16,384 ranks by "
    "the same bytes a row, not measured). It "
    "now runs a streamed precheck (two passes over the table's slices, a few values per rank "
    "and group) and builds narrow entry arrays (~19 bytes a row) only for a set with a "
    "candidate: +13 MiB at 1,024 ranks (tests/test_hang_seq_memory.py bounds its scratch), "
    "and 0.23-0.25 s CPU against 0.39-0.65 s for the check before on the same table "
    "in-process (two runs each, load ~85).",
    "The floor before any row (the real 16-rank set read and analysed compiled, warm cache): "
    "python, numpy and pyarrow 56 MiB; importing numba +63 MiB (llvmlite's LLVM library alone "
    "+40, 34 of them its file pages); the first cached kernel loaded +61 MiB (LLVM's JIT and "
    "target machine), the next few +30: ~214 MiB before the first dump. The 200 MiB target at "
    "1,024 ranks (table 78 MiB) needs no LLVM in the process at that size: not reached.",
    "MALLOC_ARENA_MAX=1 (glibc arenas of the reader's threads), one run each at load ~55: 438 "
    "against 474 MiB peak at 1,024 ranks; not applied (a process-wide setting).",
    "torch's fr_trace and the code before were not run in this run (load 50-100 on 2 cores; "
    "torch took 886 s wall for 177.48 s CPU at 1,024 ranks under load 49 in the previous run): "
    "no ratio against torch here. This run's CPU is inflated by the load (its imports alone took "
    "0.88 s CPU against 0.17 s at load ~30); at load ~55, d57b3ee (the narrow check without the "
    "precheck) took 6.34 s CPU, 474 MiB.",
)
_TARGETS = {1024: ("<= 200 MiB peak", ">= 40x torch by CPU"), 16384: ("<= 2 GB", "<= 12 s")}


def _ratio(anchor: object, value: object) -> str:
    if not isinstance(anchor, (int, float)) or not isinstance(value, (int, float)) or not value:
        return "-"
    return f"{anchor / value:.2f}x"


def memory_section(results: dict, args: argparse.Namespace) -> Section:
    """Peak RSS, CPU and the memory by phase of each size, beside torch's fr_trace and the code
    before where they ran."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO_ROOT).stdout.strip() or "-"
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    figures = []
    for row in results["sizes"]:
        fl, tt, before = row["faultlens"], row.get("torch", {}), row.get("before") or {}
        size = f"{row['ranks']:,} ranks x {results['entries_per_rank']:,} entries"
        memory_target, speed_target = _TARGETS.get(row["ranks"], ("-", "-"))
        right = "culprit right" if fl.get("correct") else "culprit WRONG"
        value = (f"{fl.get('cpu_seconds')} s CPU ({fl.get('seconds')} s wall), "
                 f"{fl.get('peak_rss_mb')} MiB, {right}")
        if "cpu_seconds" in tt:
            figures.append(Figure(f"{size}: read + analysis", value, speed_target,
                                  f"torch fr_trace: {tt['cpu_seconds']} s CPU ({tt['seconds']} s "
                                  f"wall), {tt.get('peak_rss_mb')} MiB",
                                  f"{_ratio(tt['cpu_seconds'], fl.get('cpu_seconds'))} CPU, "
                                  f"{_ratio(tt.get('peak_rss_mb'), fl.get('peak_rss_mb'))} RSS",
                                  commit, date))
        else:
            why = "timed out" if tt.get("timed_out") else "not run"
            figures.append(Figure(f"{size}: read + analysis", value, speed_target,
                                  f"torch fr_trace: {why}", "-", commit, date))
        if before:
            figures.append(Figure(
                f"{size}: read + analysis, the code before", value, memory_target,
                f"the code before: {before.get('cpu_seconds')} s CPU ({before.get('seconds')} s "
                f"wall), {before.get('peak_rss_mb')} MiB, table {before.get('table_mib')} MiB",
                f"{_ratio(before.get('cpu_seconds'), fl.get('cpu_seconds'))} CPU, "
                f"{_ratio(before.get('peak_rss_mb'), fl.get('peak_rss_mb'))} RSS", commit, date))
        figures.append(Figure(f"{size}: the table kept for pass 2",
                              f"{fl.get('table_mib')} MiB ({fl.get('table_bytes_per_row')} "
                              "bytes a row)", "-", "-", "-", commit, date))
        for phase in fl.get("phases") or []:
            figures.append(Figure(f"{size}: RSS at \"{phase['phase']}\"",
                                  f"{phase['rss_mib']} MiB (peak so far {phase['peak_mib']} MiB, "
                                  f"{phase['cpu_s']} s CPU)", "-", "-", "-", commit, date))
    load = results.get("load_average_at_start")
    loads = "; ".join(f"{row['ranks']} ranks: {', '.join(str(x) for x in row['load_average'])}"
                      for row in results["sizes"] if row.get("load_average"))
    load_text = loads or ", ".join(str(round(x, 1)) for x in load or ())
    notes = (
        f"Load average (1, 5, 15 min) at the start of each size: {load_text}, on "
        f"{os.cpu_count()} cores (a shared machine): wall figures are inflated by it, CPU figures "
        "less so, RSS not.",
        "RSS by phase: /proc/self/statm sampled every 10 ms in the measured process; peak RSS of "
        "the rows above: the child's own (wait4).",
        *NOTES,
        *(() if any(row["ranks"] == 16384 for row in results["sizes"]) else (_NOT_16384,)),
    )
    ranks = ",".join(str(row["ranks"]) for row in results["sizes"]) or args.ranks
    command = "PYTHONPATH=. python -m bench.bench_hang " + " ".join(
        [f"--ranks {ranks}", "--no-ingest" if args.no_ingest or results.get("from_json") else "",
         "--before DIR" if args.before else "",
         f"--torch-max-ranks {args.torch_max_ranks}" if args.torch_max_ranks != 1024 else "",
         f"--cli-max-ranks {args.cli_max_ranks}" if args.cli_max_ranks != 4096 else "",
         "--write"]).replace("  ", " ").replace("  ", " ").strip()
    return Section(MEMORY_TITLE, "faultlens analyze-hang's library call (reading + analysis) "
                   "on the synthetic Megatron-like sets beside torch's fr_trace on the same dumps "
                   "and the code before (DIR: git archive BASE | tar -x -C DIR); peak RSS and "
                   "where the memory goes, phase by phase.",
                   (command,), tuple(figures), notes)


def rows_from_json(paths: list[Path], entries: int) -> dict[str, object]:
    """The size rows (one JSON object a line, as each run prints them on stderr) of earlier runs,
    the last one of each size, with the load average each run started under."""
    rows: dict[int, dict] = {}
    loads = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "ranks" in row and "faultlens" in row:
                rows[row["ranks"]] = row
            elif isinstance(row, dict) and "load_average_at_start" in row:
                loads.append(row["load_average_at_start"])
    return {"entries_per_rank": entries, "machine": machine(), "sizes": [
        rows[k] for k in sorted(rows)], "load_average_at_start": loads[-1] if loads else None,
        "from_json": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024", help="comma-separated dump set sizes (default "
                                                        "1024)")
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--torch-max-ranks", type=int, default=1024,
                        help="run torch's analyzer up to this size (it needs ~4 GB at 1,024)")
    parser.add_argument("--torch-timeout", type=float, default=900)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--no-ingest", action="store_true", help="skip the ingest-rate comparison")
    parser.add_argument("--cli-max-ranks", type=int, default=4096,
                        help="also time `faultlens analyze-hang` (the CLI) up to this size")
    parser.add_argument("--naive-ranks", type=int, default=64)
    parser.add_argument("--before", type=Path, default=None,
                        help="also time the library call on the code in DIR (git archive BASE | "
                             "tar -x -C DIR), after faultlens, in the same run")
    parser.add_argument("--write", action="store_true",
                        help="publish the memory section in docs/benchmarks.md")
    parser.add_argument(
        "--workers", type=int, default=min(2, os.cpu_count() or 1), help="generator processes"
    )
    parser.add_argument("--from-json", type=Path, nargs="+", default=None,
                        help="publish (with --write) the size rows these earlier runs printed "
                             "on stderr, measuring nothing")
    args = parser.parse_args(argv)
    if args.from_json:
        results = rows_from_json(args.from_json, args.entries)
        if args.write:
            write_section(REPO_ROOT / "docs" / "benchmarks.md", memory_section(results, args))
        print(json.dumps(results, default=str))
        return 0
    sizes = [int(x) for x in args.ranks.split(",") if x.strip()]
    results: dict[str, object] = {"entries_per_rank": args.entries, "machine": machine(),
                                  "load_average_at_start": os.getloadavg(), "sizes": []}
    for world in sizes:
        directory, gen_s = ensure_set(args.cache, world, args.entries, args.workers)
        size_mb = sum(p.stat().st_size for p in directory.glob("_dump_*")) / 1e6
        row: dict[str, object] = {
            "ranks": world,
            "load_average": [round(x, 1) for x in os.getloadavg()],
            "dump_mb": round(size_mb),
            "generated_s": round(gen_s, 1),
            "culprit": _culprit(world),
        }
        row["cache_warm_s"] = round(warm_cache(directory), 1)
        row["faultlens"] = bench_faultlens(
            directory, world, args.timeout, cli=world <= args.cli_max_ranks
        )
        if args.before is not None:
            warm_cache(directory)
            row["before"] = bench_before(directory, world, args.timeout, args.before.resolve())
        if world <= args.torch_max_ranks:
            warm_cache(directory)
            row["torch"] = bench_torch(directory, world, args.torch_timeout)
            fl, tt = row["faultlens"].get("seconds"), row["torch"].get("seconds")
            if fl and tt and not row["torch"].get("timed_out"):
                row["speedup_vs_torch"] = round(tt / fl, 1)
                fl_cpu, tt_cpu = (
                    row["faultlens"].get("cpu_seconds"),
                    row["torch"].get("cpu_seconds"),
                )
                if fl_cpu and tt_cpu:
                    row["cpu_speedup_vs_torch"] = round(tt_cpu / fl_cpu, 1)
        else:
            row["torch"] = {"skipped": f"over --torch-max-ranks {args.torch_max_ranks} (torch "
                                       "needs ~4 GB at "
                                       "1,024 ranks and cannot hold 16,384 in this machine's "
                                       "memory)"}
        results["sizes"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if not args.no_ingest and "ingest" not in results:
            warm_cache(directory)  # the smallest size, while its files are in the page cache
            results["ingest"] = bench_ingest(directory, world, args.naive_ranks)
    emit("hang", results)
    if args.write:
        write_section(REPO_ROOT / "docs" / "benchmarks.md", memory_section(results, args))
    print()
    print("| ranks x entries | dumps | faultlens read + analysis wall (CPU) | peak RSS | torch "
          "fr_trace wall (CPU) | "
          "peak RSS | speed-up wall (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for row in results["sizes"]:
        fl, tt = row["faultlens"], row["torch"]
        torch_cell = (
            "skipped"
            if "skipped" in tt
            else (
                "timed out"
                if tt.get("timed_out")
                else f"{tt['seconds']} s ({tt.get('cpu_seconds')} s)"
            )
        )
        print(f"| {row['ranks']} x {args.entries} | {row['dump_mb']} MB | {fl.get('seconds')} s "
              f"({fl.get('cpu_seconds')} s) {'correct' if fl.get('correct') else 'WRONG'} | "
              f"{fl.get('peak_rss_mb')} MB | {torch_cell} | {tt.get('peak_rss_mb', '-')} MB | "
              f"{row.get('speedup_vs_torch', '-')}x ({row.get('cpu_speedup_vs_torch', '-')}x) |")
    if "ingest" in results:
        ing = results["ingest"]
        print()
        print(f"ingest {ing['ranks']} dumps: faultlens {ing['faultlens_dumps_per_s']} dumps/s "
              f"({ing['faultlens_reader_s']} s, full table) vs pickle.load "
              f"{ing['pickle_load_dumps_per_s']} dumps/s "
              f"({ing['speedup_vs_pickle_load']}x) vs naive rows {ing['naive_rows_dumps_per_s']} "
              "dumps/s "
              f"({ing['speedup_vs_naive']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
