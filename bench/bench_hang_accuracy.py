"""Hang culprits, side by side: faultlens, torch's flight-recorder analyzer and NVIDIA's
CollectiveAnalyzer on the hang corpus (real dump sets of an 8-rank gloo job,
tests/torch_jobs/hang_corpus, truth beside each), the held-out set (real gloo dump sets of other job
shapes: 4 to 16 ranks, other rank orders, groups without descs or from new_subgroups, pipelines;
tests/torch_jobs/hang_heldout) and the real NCCL set (tests/data/nccl-fr-gpu_error_2nd, the files of
NVIDIA/nvidia-resiliency-ext tests/attribution/unit/fr_traces/gpu_error_2nd; truth ranks 9 and 14)
and the stored DeviceMesh sets (tests/data/device-mesh-hangs: real 8-rank gloo jobs with groups from
init_device_mesh, dumped by faultlens' trigger with the ranks' own stacks).

    python -m bench.bench_hang_accuracy [--nvrx-python PATH] [--json OUT] [--no-heldout]

Per set and analyzer: the ranks it names as culprits, whether that is exactly the truth, and its
false ranks (named, not culprits: victims) and missed ranks. How each analyzer's answer is read:
- faultlens: analyze_collectives' culprit_ranks, with the py-spy stacks the corpus took (as the
  supervisor does), and once more from the trace alone;
- torch: `python -m torch.distributed.flight_recorder.fr_trace DIR -p _dump_` (with
  --allow-incomplete-ranks where a dump is missing), on a copy of the dumps named `_dump_<rank>`
  (its file-name rule); the ranks it names are every "missing ranks: {...}" and "Culprit rank N" it
  prints;
- NVIDIA: nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution.CollectiveAnalyzer run in
  the Python given by --nvrx-python (its own venv) on the same `_dump_<rank>` copy with its CLI's
  arguments (-p "_dump_*", no LLM); the ranks it names are the "Missing Ranks" column of the table
  it prints (what its print_output returns as "hanging ranks"); where it cannot be imported the
  table says why.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.common import emit, machine  # noqa: E402

NCCL_SET = REPO_ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"
NCCL_TRUTH = (9, 14)
# stored real gloo sets of DeviceMesh jobs, as faultlens' trigger wrote them
# (tests/data/device-mesh-hangs/README.md)
MESH_SETS = REPO_ROOT / "tests" / "data" / "device-mesh-hangs" / "stacks"
NVRX_MODULE = "nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution"
# Drives CollectiveAnalyzer as its own CLI would (fr_attribution.main: the same argparse fields,
# defaults kept, --fr-path DIR -p "_dump_*"), but runs the three registered pipeline steps in
# run_sync's order on the analyzer's own event loop: at the source read (fr_attribution.py @16a9d66,
# base.py @1eaec7b) main()'s run_sync(args) passes its input to preprocess_FR_dumps(self), which
# takes none, and do_attribution passes model=/verbose= to collective_analysis(self,
# analysis_output), which takes neither: both raise TypeError before any analysis.
NVRX_ADAPTER = r"""
import argparse, json, sys
from nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution import CollectiveAnalyzer

args = argparse.Namespace(
    fr_path=sys.argv[1],
    pattern="_dump_*",
    verbose=False,
    health_check=False,
    llm_analyze=False,
    model="nvdev/nvidia/llama-3.3-nemotron-super-49b-v1",
    debug=False,
)
analyzer = CollectiveAnalyzer(args)
loop = analyzer._loop
text = loop.run_until_complete(analyzer.preprocess_FR_dumps())
attributed = loop.run_until_complete(analyzer.collective_analysis(text))
result, _ = loop.run_until_complete(analyzer.print_output(attributed))
print(json.dumps({"text": text, "result": result}))
"""


def _faultlens(directory: Path, dumps: Path, stacks: bool) -> tuple[tuple[int, ...], float]:
    from faultlens.attribution.detectors.hang import analyze_collectives
    from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
    from faultlens.collectors.sources.pystack import load_dump_dir_stacks, load_stack_dir

    started = time.perf_counter()
    table = read_dump_dir(dumps).table
    world = _world(dumps)
    # py-spy's, beside the dumps (the corpora), else the ranks' own, which the trigger wrote among
    # them
    taken = (load_stack_dir(directory / "stacks") or load_dump_dir_stacks(dumps)) if stacks else {}
    report = analyze_collectives(table, expected_ranks=range(world), stacks=taken)
    return tuple(report.culprit_ranks), time.perf_counter() - started


def _world(dumps: Path) -> int:
    truth = dumps.parent / "truth.json"
    if truth.exists():
        return int(json.loads(truth.read_text())["world_size"])
    return len(list(dumps.glob("_dump_*")))


def _as_torch_names(dumps: Path, out: Path) -> Path:
    out.mkdir(parents=True)
    for path in sorted(dumps.iterdir()):
        match = re.match(r"^(?:rank_|_dump_)(\d+)(?:\.pkl)?$", path.name)
        if match:
            shutil.copyfile(path, out / f"_dump_{match.group(1)}")
    return out


def _named_by_torch(text: str) -> set[int]:
    named: set[int] = set()
    for found in re.findall(r"missing ranks: \{([0-9, ]*)\}", text):
        named.update(int(r) for r in found.split(",") if r.strip())
    named.update(int(r) for r in re.findall(r"Culprit rank (\d+)", text))
    return named


def _torch(dumps: Path, missing: bool) -> tuple[tuple[int, ...] | None, str]:
    with tempfile.TemporaryDirectory(prefix="fr-trace-") as temp:
        copy = _as_torch_names(dumps, Path(temp) / "dumps")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.flight_recorder.fr_trace",
            str(copy),
            "-p",
            "_dump_",
        ]
        if missing:
            cmd.append("--allow-incomplete-ranks")
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return None, "timed out"
    text = result.stdout + result.stderr
    if result.returncode != 0:
        last = [line for line in text.strip().splitlines() if line.strip()][-1:] or ["?"]
        return None, f"failed: {last[0][:120]}"
    return tuple(sorted(_named_by_torch(text))), ""


def nvrx_status(python: str | None) -> str | None:
    """None when NVIDIA's analyzer can be imported by `python`, else why not."""
    if not python:
        return "no --nvrx-python given"
    probe = subprocess.run(
        [python, "-c", f"import {NVRX_MODULE}"], capture_output=True, text=True, timeout=300
    )
    if probe.returncode == 0:
        return None
    version = subprocess.run(
        [python, "-m", "pip", "show", "nvidia-resiliency-ext"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    have = re.search(r"^Version: (\S+)", version, re.M)
    last = (probe.stderr.strip().splitlines() or ["?"])[-1]
    return (f"nvidia-resiliency-ext {have.group(1) if have else '(not installed)'} from PyPI has "
            f"no {NVRX_MODULE} "
            f"({last})")


def _nvrx(python: str, dumps: Path) -> tuple[tuple[int, ...] | None, str]:
    with tempfile.TemporaryDirectory(prefix="nvrx-") as temp:
        copy = _as_torch_names(dumps, Path(temp) / "dumps")
        result = subprocess.run(
            [python, "-c", NVRX_ADAPTER, str(copy)], capture_output=True, text=True, timeout=600
        )
    if result.returncode != 0:
        return None, f"failed: {(result.stderr.strip().splitlines() or ['?'])[-1][:120]}"
    lines = result.stdout.strip().splitlines()
    if not lines:
        return None, "printed nothing"
    return _named_by_nvrx(json.loads(lines[-1])["text"]), ""


def _named_by_nvrx(text: str) -> tuple[int, ...]:
    """The ranks in the last column of CollectiveAnalyzer's table (the field its print_output
    reports as "hanging ranks"), where that column is "Missing Ranks". Where no group has a missing
    rank it prints the head groups' "Completed Ranks" table instead (whose last field is then the
    group's rank count): it names no rank."""
    rows = [line.split("|") for line in text.splitlines() if len(line.split("|")) >= 6]
    if not rows or rows[0][-1].strip() != "Missing Ranks":
        return ()
    return tuple(sorted({int(r) for row in rows[1:] for r in re.findall(r"\d+", row[-1])}))


def _score(named: tuple[int, ...] | None, truth: tuple[int, ...]) -> dict[str, object]:
    if named is None:
        return {"named": None, "exact": False, "false": None, "missed": None}
    return {
        "named": list(named),
        "exact": set(named) == set(truth),
        "false": sorted(set(named) - set(truth)),
        "missed": sorted(set(truth) - set(named)),
    }


def sets(heldout: bool = True) -> list[tuple[str, Path, Path, tuple[int, ...]]]:
    """(name, directory, dumps directory, truth): the corpus, the held-out set (other job shapes;
    its names start with the layout, e.g. l12_), the real NCCL set."""
    from tests.torch_jobs.hang_corpus.generate import corpus

    generated = dict(corpus())
    if heldout:
        from tests.torch_jobs.hang_heldout.generate import heldout as heldout_sets

        generated |= {f"held-out {name}": directory for name, directory in heldout_sets().items()}
    out = []
    for name, directory in generated.items():
        truth = json.loads((directory / "truth.json").read_text())
        out.append((name, directory, directory / "dumps", tuple(truth["culprits"])))
    out.append(("real NCCL set (gpu_error_2nd, 16 ranks)", NCCL_SET, NCCL_SET, NCCL_TRUTH))
    for directory in sorted(p for p in MESH_SETS.iterdir() if p.is_dir()):
        truth = json.loads((directory / "truth.json").read_text())
        out.append(
            (
                f"device-mesh {directory.name}",
                directory,
                directory / "dumps",
                tuple(truth["culprits"]),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvrx-python", default=None, help="a Python whose environment has "
                                                            "nvidia-resiliency-ext")
    parser.add_argument("--json", default=None, help="also write the JSON document here")
    parser.add_argument(
        "--no-heldout", action="store_true", help="the corpus and the NCCL set only"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    nvrx_missing = nvrx_status(args.nvrx_python)
    rows = []
    for name, directory, dumps, truth in sets(heldout=not args.no_heldout):
        world = _world(dumps)
        have = len([p for p in dumps.iterdir() if re.match(r"^(rank_|_dump_)\d+", p.name)])
        with_stacks, seconds = _faultlens(directory, dumps, stacks=True)
        alone, _ = _faultlens(directory, dumps, stacks=False)
        torch_named, torch_note = _torch(dumps, missing=have < world)
        if nvrx_missing is None:
            nvrx_named, nvrx_note = _nvrx(args.nvrx_python, dumps)
        else:
            nvrx_named, nvrx_note = None, "unavailable"
        rows.append(
            {
                "set": name,
                "truth": list(truth),
                "faultlens": _score(with_stacks, truth),
                "faultlens_seconds": round(seconds, 3),
                "faultlens_trace_only": _score(alone, truth),
                "torch": _score(torch_named, truth) | {"note": torch_note},
                "nvidia": _score(nvrx_named, truth) | {"note": nvrx_note},
            }
        )
    document = {
        "machine": machine(),
        "nvidia_unavailable": nvrx_missing,
        "seconds": round(time.perf_counter() - started, 1),
        "totals": _totals(rows),
        "totals_by_family": {
            family: _totals([r for r in rows if _family(r["set"]) == family])
            for family in FAMILIES
            if any(_family(r["set"]) == family for r in rows)
        },
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1))
    emit("hang_accuracy", document)
    print()
    print(markdown(document))
    return 0


FAMILIES = ("corpus", "held-out", "real NCCL", "device-mesh")


def _family(name: str) -> str:
    for prefix, family in (
        ("held-out ", "held-out"),
        ("real NCCL", "real NCCL"),
        ("device-mesh ", "device-mesh"),
    ):
        if name.startswith(prefix):
            return family
    return "corpus"


def _totals(rows: list[dict]) -> dict[str, dict[str, int]]:
    totals = {}
    for key in ("faultlens", "faultlens_trace_only", "torch", "nvidia"):
        scored = [r[key] for r in rows]
        totals[key] = {"exact": sum(1 for s in scored if s["exact"]), "sets": len(rows),
                       "false_ranks": sum(len(s["false"] or ()) for s in scored),
                       "missed_ranks": sum(len(s["missed"] or ()) for s in scored),
                       "no_answer": sum(1 for s in scored if s["named"] is None)}
    return totals


def _cell(score: dict) -> str:
    if score["named"] is None:
        return "no answer" + (
            f" ({score.get('note')})" if score.get("note") not in (None, "", "unavailable") else ""
        )
    named = ", ".join(map(str, score["named"])) or "none"
    mark = "exact" if score["exact"] else "wrong"
    extra = []
    if score["false"]:
        extra.append(f"false {', '.join(map(str, score['false']))}")
    if score["missed"]:
        extra.append(f"missed {', '.join(map(str, score['missed']))}")
    return f"{mark}: {named}" + (f" ({'; '.join(extra)})" if extra else "")


def markdown(document: dict) -> str:
    lines = ["| set | truth | faultlens (trace + stacks) | faultlens (trace only) | torch fr_trace "
             "| NVIDIA |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in document["rows"]:
        lines.append(f"| {r['set']} | {', '.join(map(str, r['truth'])) or 'none'} | "
                     f"{_cell(r['faultlens'])} | "
                     f"{_cell(r['faultlens_trace_only'])} | {_cell(r['torch'])} | "
                     f"{_cell(r['nvidia'])} |")
    totals = [(f"{family}: exact sets / false ranks / missed ranks", t)
              for family, t in document.get("totals_by_family", {}).items()]
    totals.append(("all: exact sets / false ranks / missed ranks", document["totals"]))
    for label, t in totals:
        lines.append(
            f"| **{label}** | | "
            + " | ".join(
                f"**{t[k]['exact']}/{t[k]['sets']}** / {t[k]['false_ranks']} / "
                f"{t[k]['missed_ranks']}"
                for k in ("faultlens", "faultlens_trace_only", "torch", "nvidia")
            )
            + " |"
        )
    if document.get("nvidia_unavailable"):
        lines.append("")
        lines.append(f"NVIDIA's CollectiveAnalyzer: not run: {document['nvidia_unavailable']}.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
