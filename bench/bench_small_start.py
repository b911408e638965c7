"""Where a user feels the start: `faultlens analyze-hang` on a real 16-rank NCCL dump set and
`faultlens sql --store EMPTY "select 1"`, whole processes, beside the peers a user would run
instead, alternated in one run.

    PYTHONPATH=. python -m bench.bench_small_start [--runs 7] [--before DIR] [--nvidia-src SRC]

Every process may write and read byte code (__pycache__, as an installed package has it; the
warm-up run writes it). Cases, each a fresh process per run, the cases alternated run by run (load
moves every case the same way); per case the medians of wall seconds, CPU seconds (user + sys of
the child, from wait4) and the peak RSS (MiB, wait4):
- analyze_hang: `python -m faultlens.controller.cli.main analyze-hang DIR` (this tree), its
  culprits checked against the set's truth (ranks 9 and 14);
- analyze_hang_before: the same command on the tree given by --before (an export of the commit
  before, e.g. `git archive BASE | tar -x -C DIR`), where given;
- torch_fr_trace: torch's analyzer, `python -m torch.distributed.flight_recorder.fr_trace DIR -p
  _dump_`;
- nvidia_fr_attribution (with --nvidia-src SRC): NVIDIA's CollectiveAnalyzer as its users run it,
  `python SRC/nvidia_resiliency_ext/attribution/trace_analyzer/fr_attribution.py --fr-path DIR -p
  '_dump_*'` with SRC on PYTHONPATH (SRC: the src/ folder of a checkout of
  NVIDIA/nvidia-resiliency-ext; PyPI's wheel, 0.4.1, lacks attribution.trace_analyzer), its
  answer (the "Missing Ranks" of the table it logs) checked against the same truth;
- pickle_floor: python unpickling the 16 dumps and nothing else (what any pure-Python analyzer
  pays before its analysis);
- import_numpy_pyarrow: `python -c "import numpy, pyarrow"`;
- sql_select1 (and sql_select1_before): `faultlens sql --store EMPTY "select 1"`;
- import_duckdb_pyarrow: `python -c "import duckdb, pyarrow"` (the issue's anchor for sql).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Figure, Section, emit, machine, write_section  # noqa: E402

NCCL = ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"
TRUTH = "culprit rank(s): 9, 14"
PICKLES = (
    "import glob, pickle, sys\n"
    "for path in sorted(glob.glob(sys.argv[1] + '/_dump_*')):\n"
    "    with open(path, 'rb') as f:\n"
    "        pickle.load(f)\n"
)


# DuckDB answering the same query from Python: the import, a connection (its catalog: ~30 ms of
# CPU), the query, an Arrow result
DUCKDB_SELECT1 = "import duckdb, pyarrow; duckdb.connect().sql('select 1').to_arrow_table()"
NVIDIA_MODULE = "nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution"


def nvidia_analyzer() -> str:
    """Whether NVIDIA's flight-recorder analyzer can run here, and if not, exactly why."""
    import importlib.util

    try:
        found = importlib.util.find_spec(NVIDIA_MODULE) is not None
    except ModuleNotFoundError as exc:
        found, missing = False, exc.name
    else:
        missing = None if found else NVIDIA_MODULE
    if found:
        return "installed"
    return (
        f"not run: {missing or NVIDIA_MODULE} cannot be imported. The package index's newest "
        "nvidia-resiliency-ext is 0.4.1 (0.1.3-0.4.1 listed), whose wheel holds checkpointing, "
        "fault_tolerance, inprocess and ptl_resiliency but no attribution.trace_analyzer "
        "(CollectiveAnalyzer is only in NVIDIA's source tree): `pip download "
        "nvidia-resiliency-ext` gets that wheel"
    )


def _run(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    """One process: wall, CPU (user + sys) and peak RSS from wait4, and its stdout (and stderr,
    where NVIDIA's analyzer logs its answer). It runs in the tree its PYTHONPATH names (`python -m`
    puts the working directory first on sys.path)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss / 1024,
        "rc": proc.returncode,
        "out": out.decode(errors="replace"),
    }


NVIDIA_SCRIPT = Path("nvidia_resiliency_ext", "attribution", "trace_analyzer", "fr_attribution.py")


def nvidia_source(src: Path) -> Path:
    """The folder holding `nvidia_resiliency_ext` (SRC or SRC/src); SystemExit naming what is
    missing."""
    for root in (src, src / "src"):
        if (root / NVIDIA_SCRIPT).is_file():
            return root.resolve()
    raise SystemExit(f"{src}: no {NVIDIA_SCRIPT} under it or under its src/")


def nvidia_culprits(out: str) -> list[int] | None:
    """The ranks NVIDIA's analyzer names: the last column ("Missing Ranks") of the rows under the
    last header of the table it logs; None where it logged none."""
    lines = out.splitlines()
    heads = [i for i, line in enumerate(lines) if "| Missing Ranks" in line]
    if not heads:
        return None
    ranks: set[int] = set()
    for line in lines[heads[-1] + 1 :]:
        cells = line.split("|")
        if len(cells) < 6:
            break
        ranks.update(int(r) for r in cells[-1].replace(" ", "").split(",") if r.isdigit())
    return sorted(ranks)


def _cases(
    store: Path, before: Path | None, nvidia: Path | None = None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    py = sys.executable
    # byte code written and read, as an installed package has it (a process that may not write
    # it compiles every faultlens module at each start)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    here = {**base, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    cli = [py, "-m", "faultlens.controller.cli.main"]
    cases = {
        "analyze_hang": ([*cli, "analyze-hang", str(NCCL)], here),
        "torch_fr_trace": (
            [py, "-m", "torch.distributed.flight_recorder.fr_trace", str(NCCL), "-p", "_dump_"],
            here,
        ),
        "pickle_floor": ([py, "-c", PICKLES, str(NCCL)], here),
        "import_numpy_pyarrow": ([py, "-c", "import numpy, pyarrow"], here),
        "sql_select1": ([*cli, "sql", "--store", str(store), "select 1"], here),
        "import_duckdb_pyarrow": ([py, "-c", "import duckdb, pyarrow"], here),
        "duckdb_select1": ([py, "-c", DUCKDB_SELECT1], here),
    }
    if nvidia is not None:
        script = str(nvidia / NVIDIA_SCRIPT)
        cases["nvidia_fr_attribution"] = (
            [py, script, "--fr-path", str(NCCL), "-p", "_dump_*"],
            {**base, "PYTHONPATH": str(nvidia)},
        )
    if before is not None:
        there = {**here, "PYTHONPATH": str(before)}
        cases["analyze_hang_before"] = ([*cli, "analyze-hang", str(NCCL)], there)
        cases["sql_select1_before"] = ([*cli, "sql", "--store", str(store), "select 1"], there)
    return cases


def _last_json(path: Path) -> dict:
    """The last JSON line of a benchmark's output (its emitted result)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def _ratio(a: dict[str, float], b: dict[str, float], key: str) -> float:
    return round(a[key] / b[key], 2) if b[key] else float("nan")


TITLE = 'Small sets and the CLI start: `analyze-hang` on a real 16-rank set, `sql "select 1"`'


def _cell(case: dict[str, object]) -> str:
    return f"{case['cpu_s']:.3f} s CPU ({case['wall_s']:.2f} s wall, {case['peak_rss_mib']} MiB)"


def _scale_figures(scale: dict[str, dict], commit: str, date: str) -> list[Figure]:
    """bench_hang's rows on this tree ("after") and the tree before ("before"), same dump set."""
    after = {row["ranks"]: row for row in scale.get("after", {}).get("sizes", [])}
    before = {row["ranks"]: row for row in scale.get("before", {}).get("sizes", [])}
    out = []
    for ranks, row in sorted(after.items()):
        mine = row["faultlens"]
        value = (
            f"{mine['cpu_seconds']} s CPU ({mine['seconds']} s wall), {mine['peak_rss_mb']} MB"
            + (", culprit right" if mine.get("correct") else "")
        )
        torch = row.get("torch", {})
        if torch.get("cpu_seconds"):
            out.append(
                Figure(
                    f"{ranks:,} ranks x 2,000 entries: read + analysis",
                    value,
                    ">= 40x torch by CPU",
                    f"torch fr_trace {torch['cpu_seconds']} s CPU ({torch['seconds']} s wall), "
                    f"{torch['peak_rss_mb']} MB",
                    f"{row.get('cpu_speedup_vs_torch')}x CPU",
                    commit,
                    date,
                )
            )
        elif torch.get("timed_out"):
            out.append(
                Figure(
                    f"{ranks:,} ranks x 2,000 entries: read + analysis",
                    value,
                    ">= 40x torch by CPU",
                    f"torch fr_trace: timed out after {torch['seconds']} s wall (machine load)",
                    "-",
                    commit,
                    date,
                )
            )
        old = before.get(ranks, {}).get("faultlens")
        if old:
            out.append(
                Figure(
                    f"{ranks:,} ranks x 2,000 entries: read + analysis, the code before",
                    value,
                    "<= 200 MiB peak",
                    f"the code before: {old['cpu_seconds']} s CPU "
                    f"({old['seconds']} s wall), {old['peak_rss_mb']} MB",
                    f"{round(old['cpu_seconds'] / mine['cpu_seconds'], 2)}x CPU",
                    commit,
                    date,
                )
            )
    return out


def _scale_notes(scale: dict) -> list[str]:
    if not scale.get("after"):
        return []
    load = scale["after"].get("load_average_at_start", [0])[0]
    return [
        "The 1,024-rank rows: bench_hang on this tree and on the export before, one after the "
        f"other on the same cached dump set (not alternated; load {load:.0f} at the start of "
        "this tree's run); torch's fr_trace is cut at --torch-timeout (900 s wall)."
    ]


def section(
    result: dict[str, object], commit: str, date: str, scale: dict[str, dict] | None = None
) -> Section:
    """The published form of one run (docs/benchmarks.md); `scale`: bench_hang's results on this
    tree and the one before ({"after": ..., "before": ...}), where run."""
    hang, torch = result["analyze_hang"], result["torch_fr_trace"]
    sql, duck = result["sql_select1"], result["import_duckdb_pyarrow"]
    floor = result["import_numpy_pyarrow"]
    figures = [
        Figure(
            "`faultlens analyze-hang` on tests/data/nccl-fr-gpu_error_2nd, whole process",
            _cell(hang) + (", culprits 9, 14 exact" if hang.get("exact_culprits") else ""),
            "no slower than NVIDIA's analyzer",
            "torch fr_trace: " + _cell(torch),
            f"{result['torch_over_analyze_hang_cpu']}x CPU, "
            f"{result['torch_over_analyze_hang_wall']}x wall",
            commit,
            date,
        ),
    ]
    if "analyze_hang_before" in result:
        before = result["analyze_hang_before"]
        figures.append(
            Figure(
                "`faultlens analyze-hang`, the code before",
                _cell(hang),
                "-",
                "the same command before: " + _cell(before),
                f"{result['before_over_analyze_hang_cpu']}x CPU",
                commit,
                date,
            )
        )
    figures += [
        Figure(
            "python importing numpy and pyarrow (the floor of any Arrow analysis)",
            _cell(floor),
            "-",
            "python unpickling the 16 dumps: " + _cell(result["pickle_floor"]),
            "-",
            commit,
            date,
        ),
        Figure(
            '`faultlens sql --store EMPTY "select 1"`',
            _cell(sql),
            "<= 1.2x the import",
            "python -c 'import duckdb, pyarrow': " + _cell(duck),
            f"{round(1 / result['sql_over_duckdb_pyarrow_import_cpu'], 2)}x CPU",
            commit,
            date,
        ),
        Figure(
            '`faultlens sql --store EMPTY "select 1"` beside DuckDB answering it from Python',
            _cell(sql),
            "-",
            "python -c 'import duckdb, pyarrow; duckdb.connect().sql(\"select 1\")"
            ".to_arrow_table()': " + _cell(result["duckdb_select1"]),
            f"{round(1 / result['sql_over_duckdb_select1_cpu'], 2)}x CPU",
            commit,
            date,
        ),
    ]
    scale = scale or {}
    figures += _scale_figures(scale, scale.get("commit", commit), scale.get("date", date))
    return Section(
        title=TITLE,
        compares="faultlens' whole processes beside what a user would run instead, alternated "
        "run by run in one run: torch's fr_trace on the same dumps (NVIDIA's CollectiveAnalyzer "
        'is not installable from PyPI; see "Hang culprits"), the same commands on the code '
        "before, and the imports a command cannot avoid. Medians; CPU is user + sys of the child "
        "(wait4), the steadier figure on a loaded machine.",
        commands=(
            "PYTHONPATH=. python -m bench.bench_small_start --runs 5 --before DIR  "
            "# DIR: git archive BASE | tar -x -C DIR",
            "PYTHONPATH=. python bench/bench_hang.py --ranks 1024 --no-ingest  # here and in DIR",
        ),
        figures=tuple(figures),
        notes=(
            *_scale_notes(scale),
            f"Load average {result['load_avg_1m']} on {result['machine']['cores']} cores during "
            "the run: the wall figures are inflated by it, the CPU figures are comparable.",
            "NVIDIA's analyzer: " + result["nvidia_analyzer"] + ". Issue 38 saw it at "
            "0.118 s wall, 26 MiB on an idle machine, pure Python on pickles like the pickle "
            "floor above; faultlens pays the numpy + pyarrow import first.",
            "`sql` beyond the import: DuckDB's connection (its catalog, ~30 ms CPU, paid by any "
            "query) and the query; faultlens lists and binds only the tables a query names, "
            "resolves a local store without fsspec, imports pyarrow.parquet only to read a "
            "segment, builds only the parser of the command run and draws a plain table without "
            "rich.",
        ),
    )


NVIDIA_TITLE = (
    "Small hang set in a blink: `analyze-hang` beside NVIDIA's analyzer (16-rank real set)"
)


def nvidia_section(result: dict[str, object], commit: str, date: str) -> Section:
    """The published form of a run with --nvidia-src: the 16-rank set's whole processes, NVIDIA's
    analyzer first (its answer beside ours), then torch's, the code before and the floors."""
    hang, nvidia = result["analyze_hang"], result["nvidia_fr_attribution"]
    mine = _cell(hang) + (", culprits 9, 14 exact" if hang.get("exact_culprits") else "")
    answer = " / ".join(nvidia.get("culprits", [])) or "none"
    figures = [
        Figure(
            "`faultlens analyze-hang` on tests/data/nccl-fr-gpu_error_2nd, whole process",
            mine,
            "no slower than NVIDIA's analyzer",
            "NVIDIA fr_attribution.py: " + _cell(nvidia) + f", Missing Ranks {answer}",
            f"{result['nvidia_over_analyze_hang_cpu']}x CPU, "
            f"{result['nvidia_over_analyze_hang_wall']}x wall",
            commit,
            date,
        ),
        Figure(
            "`faultlens analyze-hang`, beside torch",
            mine,
            "-",
            "torch fr_trace: " + _cell(result["torch_fr_trace"]),
            f"{result['torch_over_analyze_hang_cpu']}x CPU",
            commit,
            date,
        ),
    ]
    if "analyze_hang_before" in result:
        figures.append(
            Figure(
                "`faultlens analyze-hang`, the code before",
                mine,
                "-",
                "the same command before: " + _cell(result["analyze_hang_before"]),
                f"{result['before_over_analyze_hang_cpu']}x CPU",
                commit,
                date,
            )
        )
    figures.append(
        Figure(
            "python importing numpy and pyarrow (what the columnar path pays first)",
            _cell(result["import_numpy_pyarrow"]),
            "-",
            "python unpickling the 16 dumps: " + _cell(result["pickle_floor"]),
            "-",
            commit,
            date,
        )
    )
    return Section(
        title=NVIDIA_TITLE,
        compares="Whole processes alternated run by run in one run: `faultlens analyze-hang DIR` "
        "beside NVIDIA's CollectiveAnalyzer run as its users run it (`python fr_attribution.py "
        "--fr-path DIR -p '_dump_*'`, from NVIDIA/nvidia-resiliency-ext's source: PyPI's wheel "
        "lacks it), torch's fr_trace, the same command on the code before, and the imports the "
        "columnar path cannot avoid. Medians; CPU is user + sys of the child (wait4), the steadier "
        "figure on a loaded machine; each analyzer's answer checked against the set's truth.",
        commands=(
            "PYTHONPATH=. python -m bench.bench_small_start --runs 5 --before DIR --nvidia-src SRC "
            "# DIR: git archive BASE | tar -x -C DIR; SRC: nvidia-resiliency-ext's src/",
        ),
        figures=tuple(figures),
        notes=(
            f"Load average {result['load_avg_1m']} on {result['machine']['cores']} cores during "
            "the run: the wall figures are inflated by it, the CPU figures are comparable.",
            "Where the time goes: the columnar path imports numpy and pyarrow "
            f"({result['import_numpy_pyarrow']['cpu_s']} s CPU with the interpreter) before it "
            f"reads a byte; NVIDIA's whole process is {nvidia['cpu_s']} s. Level with it needs "
            "a small set read and judged without either import (not built yet).",
            "NVIDIA's code, fetched from its repository (fr_attribution.py, base.py, utils.py and "
            "the package __init__s, kept outside this repository), needed two one-line "
            "reconciliations to run through its own main(): base.py of the stored version passes "
            "the args to preprocess_FR_dumps(self) and model/verbose to collective_analysis(self, "
            "analysis_output), which that fr_attribution.py does not take. Its table goes to "
            "stderr through logging; the bench reads the rows under its last 'Missing Ranks' "
            "header.",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a checkout (or export) of the code before, to run beside",
    )
    parser.add_argument(
        "--nvidia-src",
        type=Path,
        default=None,
        help="NVIDIA/nvidia-resiliency-ext's src/ (or checkout): run its analyzer beside",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="write the result's section into this file (docs/benchmarks.md)",
    )
    parser.add_argument("--commit", default="-", help="the commit measured, for --doc")
    parser.add_argument(
        "--scale",
        nargs=2,
        type=Path,
        metavar=("AFTER", "BEFORE"),
        default=None,
        help="bench_hang's JSON lines on this tree and on --before's, for --doc",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "empty-store"
        store.mkdir()
        nvidia = nvidia_source(args.nvidia_src) if args.nvidia_src is not None else None
        cases = _cases(store, args.before, nvidia)
        samples: dict[str, list[dict[str, object]]] = {name: [] for name in cases}
        for cmd, env in cases.values():  # warm the page cache
            _run(cmd, env)
        for _ in range(args.runs):
            for name, (cmd, env) in cases.items():
                samples[name].append(_run(cmd, env))
    results: dict[str, dict[str, object]] = {}
    for name, runs in samples.items():
        results[name] = {
            "wall_s": round(statistics.median(r["wall"] for r in runs), 3),
            "cpu_s": round(statistics.median(r["cpu"] for r in runs), 3),
            "peak_rss_mib": round(statistics.median(r["rss"] for r in runs)),
            "exit_codes": sorted({r["rc"] for r in runs}),
        }
    for name in ("analyze_hang", "analyze_hang_before"):
        if name in samples:
            results[name]["exact_culprits"] = all(TRUTH in r["out"] for r in samples[name])
    if "nvidia_fr_attribution" in samples:
        answers = {str(nvidia_culprits(str(r["out"]))) for r in samples["nvidia_fr_attribution"]}
        results["nvidia_fr_attribution"]["culprits"] = sorted(answers)
        results["nvidia_fr_attribution"]["exact_culprits"] = answers == {str([9, 14])}
    hang, sql = results["analyze_hang"], results["sql_select1"]
    ratios = {
        "torch_over_analyze_hang_wall": _ratio(results["torch_fr_trace"], hang, "wall_s"),
        "torch_over_analyze_hang_cpu": _ratio(results["torch_fr_trace"], hang, "cpu_s"),
        "sql_over_duckdb_pyarrow_import_wall": _ratio(
            sql, results["import_duckdb_pyarrow"], "wall_s"
        ),
        "sql_over_duckdb_pyarrow_import_cpu": _ratio(
            sql, results["import_duckdb_pyarrow"], "cpu_s"
        ),
    }
    if "nvidia_fr_attribution" in results:
        nv = results["nvidia_fr_attribution"]
        ratios["nvidia_over_analyze_hang_cpu"] = _ratio(nv, hang, "cpu_s")
        ratios["nvidia_over_analyze_hang_wall"] = _ratio(nv, hang, "wall_s")
    if "analyze_hang_before" in results:
        ratios["before_over_analyze_hang_cpu"] = _ratio(
            results["analyze_hang_before"], hang, "cpu_s"
        )
        ratios["before_over_analyze_hang_wall"] = _ratio(
            results["analyze_hang_before"], hang, "wall_s"
        )
        ratios["sql_before_over_sql_cpu"] = _ratio(results["sql_select1_before"], sql, "cpu_s")
    ratios["sql_over_duckdb_select1_cpu"] = _ratio(sql, results["duckdb_select1"], "cpu_s")
    result = {
        "nvidia_analyzer": (
            f"run from NVIDIA's source ({NVIDIA_SCRIPT})" if args.nvidia_src else nvidia_analyzer()
        ),
        "runs": args.runs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "machine": machine(),
        **results,
        **ratios,
    }
    emit("small_start", result)
    if args.doc is not None:
        date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        scale = None
        if args.scale:
            after, before = args.scale
            scale = {"after": _last_json(after), "before": _last_json(before)}
        if "nvidia_fr_attribution" in result:
            write_section(args.doc, nvidia_section(result, args.commit, date))
        else:
            write_section(args.doc, section(result, args.commit, date, scale))
    print(json.dumps(ratios, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
