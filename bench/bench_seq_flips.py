"""Flipped sequence ids in real dump sets: does one corrupted seq id in a rank that is not a culprit
change the hang verdict, and is each contradiction named?

    # the 150 one-bit flips of the NCCL set (what CI samples fewer of: tests/test_hostile_fr_seq.py)
    python -m bench.bench_seq_flips --family bit --n 150
    # one flipped byte of the seq id's pickle encoding, every (rank, entry, field, byte) once
    python -m bench.bench_seq_flips --family byte --n 0 --sets nccl,gloo

Each mutant is a real set (the public NCCL set, 16 ranks; real gloo sets of 4 and 8 ranks from
torchrun jobs) with one entry of one non-culprit rank changed: its collective_seq_id (or, on a
send/recv, its p2p_seq_id) with one bit flipped (bits 0-15), or one byte of the integer's pickle
encoding (BININT1/BININT2/BININT: 1, 2 or 4 bytes) replaced by another; still a valid pickle.
The set is read and analysed as `faultlens analyze-hang` does (controller/hang_dump_dir.py) and
the verdict (kind and culprit ranks) compared with the intact set's. Counted: verdicts changed
(the mutated rank added, other innocent ranks added, a real culprit dropped), mutants named (the
dump refused with a line naming it, or a contradiction noted), and silent changes (a changed
verdict with no note).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DATA = REPO / "tests" / "data"
MESH = DATA / "device-mesh-hangs" / "raw"
#: name -> (directory of dumps, the ranks the fault was given)
SETS: dict[str, tuple[Path, tuple[int, ...]]] = {
    "nccl": (DATA / "nccl-fr-gpu_error_2nd", (9, 14)),
}
#: real gloo sets (torchrun jobs, torch's own dumps, unedited) whose intact verdict is the truth
GLOO = {
    "gloo-chain2_4": DATA / "skip-before-history" / "raw" / "chain2_4",
    "gloo-pair_4": DATA / "skip-before-history" / "raw" / "pair_4",
    "gloo-chain2_8": DATA / "skip-before-history" / "raw" / "chain2_8",
    "gloo-mesh-A_tp": MESH / "A_tp",
    "gloo-mesh-E_first": MESH / "E_first",
    "gloo-mesh-H_2d42": MESH / "H_2d42",
    "gloo-mesh-I_2d24": MESH / "I_2d24",
    "gloo-mesh-J_1d": MESH / "J_1d",
}


#: rules/policy.yaml confidence_threshold: below it no node is failed over
FAILOVER_CONFIDENCE = 0.6


def gloo_sets() -> dict[str, tuple[Path, tuple[int, ...]]]:
    out = {}
    for name, case in GLOO.items():
        truth = json.loads((case / "truth.json").read_text())
        out[name] = (case / "dumps", tuple(truth["culprits"]))
    return out


def dump_files(directory: Path) -> dict[int, Path]:
    """rank -> its pickle dump (`_dump_<rank>` or `rank_<rank>.pkl`)."""
    out = {}
    for path in directory.iterdir():
        stem = path.name.removesuffix(".pkl")
        for prefix in ("_dump_", "rank_"):
            if (
                stem.startswith(prefix)
                and stem[len(prefix) :].isdigit()
                and path.suffix in ("", ".pkl")
            ):
                out[int(stem[len(prefix) :])] = path
    return out


@dataclass(frozen=True)
class Mutant:
    set_name: str
    rank: int
    entry: int
    field: str
    old: int
    new: int
    how: str  # "bit 3" / "byte 1"

    def label(self) -> str:
        return (
            f"{self.set_name} rank {self.rank} entry {self.entry} {self.field} {self.old} -> "
            f"{self.new} ({self.how})"
        )


def _width(value: int) -> int:
    return 1 if 0 <= value < 256 else 2 if 0 <= value < 65536 else 4


def mutants(
    set_name: str, directory: Path, culprits: tuple[int, ...], family: str, rng: random.Random
) -> list[Mutant]:
    out = []
    for rank, path in sorted(dump_files(directory).items()):
        if rank in culprits:
            continue
        obj = pickle.loads(path.read_bytes())
        for i, entry in enumerate(obj.get("entries") or ()):
            fields = ["collective_seq_id"]
            if entry.get("is_p2p") or " " in str(entry.get("profiling_name", "")):
                fields.append("p2p_seq_id")
            for field in fields:
                old = entry.get(field)
                if not isinstance(old, int) or isinstance(old, bool):
                    continue
                if family == "bit":
                    for bit in range(16):
                        out.append(
                            Mutant(set_name, rank, i, field, old, old ^ (1 << bit), f"bit {bit}")
                        )
                    continue
                width = _width(old)
                for k in range(width):
                    byte = (old >> (8 * k)) & 0xFF
                    other = rng.choice([b for b in range(256) if b != byte])
                    new = old ^ ((byte ^ other) << (8 * k))
                    if width == 4 and new >= 1 << 31:  # BININT is signed
                        new -= 1 << 32
                    out.append(Mutant(set_name, rank, i, field, old, new, f"byte {k}"))
    return out


def _verdict(report: Any) -> tuple[str, tuple[int, ...]]:
    return str(report.verdict), tuple(sorted(report.culprit_ranks))


def _notes(dumps: Any, report: Any, path: Path) -> list[str]:
    lines = [str(e) for e in dumps.errors if Path(e.path).name == path.name]
    lines += [line for line in report.evidence if "contradict" in line]
    return lines


def run(
    sets: dict[str, tuple[Path, tuple[int, ...]]], family: str, n: int, seed: int
) -> dict[str, Any]:
    from faultlens.controller.hang_dump_dir import analyze_dump_dir

    rng = random.Random(seed)
    counts = dict(
        mutants=0,
        unchanged=0,
        changed=0,
        adds_mutated=0,
        adds_innocent=0,
        drops_culprit=0,
        named=0,
        silent_changes=0,
        as_missing=0,
        changed_confident=0,
    )
    changed: list[str] = []
    per_set: dict[str, dict[str, int]] = {}
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        for set_name, (directory, culprits) in sets.items():
            work = Path(tmp) / set_name
            shutil.copytree(directory, work)
            _, intact = analyze_dump_dir(work, processes=1)
            reference = _verdict(intact)
            files = dump_files(work)
            family_list = mutants(set_name, work, culprits, family, rng)
            if n:
                rng.shuffle(family_list)
                family_list = family_list[:n]
            mine = per_set.setdefault(set_name, dict(mutants=0, changed=0, named=0))
            without: dict[int, tuple[str, tuple[int, ...]]] = {}
            for m in family_list:
                path = files[m.rank]
                original = path.read_bytes()
                obj = pickle.loads(original)
                obj["entries"][m.entry][m.field] = m.new
                path.write_bytes(pickle.dumps(obj, protocol=2))
                try:
                    dumps, report = analyze_dump_dir(work, processes=1)
                finally:
                    path.write_bytes(original)
                got = _verdict(report)
                notes = _notes(dumps, report, path)
                counts["mutants"] += 1
                mine["mutants"] += 1
                counts["named"] += bool(notes)
                mine["named"] += bool(notes)
                if got == reference:
                    counts["unchanged"] += 1
                    continue
                counts["changed"] += 1
                mine["changed"] += 1
                added = set(got[1]) - set(reference[1])
                counts["adds_mutated"] += m.rank in added
                counts["adds_innocent"] += bool(added - {m.rank})
                counts["drops_culprit"] += bool(set(reference[1]) - set(got[1]))
                counts["silent_changes"] += not notes
                # the verdict with that rank's dump not there at all: what a refused dump is read as
                if m.rank not in without:
                    original = path.read_bytes()
                    path.unlink()
                    try:
                        without[m.rank] = _verdict(analyze_dump_dir(work, processes=1)[1])
                    finally:
                        path.write_bytes(original)
                counts["as_missing"] += got == without[m.rank]
                counts["changed_confident"] += report.confidence >= FAILOVER_CONFIDENCE
                changed.append(
                    f"{m.label()}: {reference} -> {got} at {report.confidence:.2f}"
                    + (f" [{notes[0][:160]}]" if notes else " [no note]")
                )
    counts["cpu_s"] = round(time.process_time() - cpu0, 1)
    return {"family": family, "seed": seed, **counts, "per_set": per_set, "changed_cases": changed}


def _section(result: dict[str, Any], args: argparse.Namespace, load: str) -> Any:
    import subprocess

    from bench.common import Figure, Section

    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        or "-"
    )
    date = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    r = result
    return Section(
        title=f"Flipped sequence ids ({r['family']} family)",
        compares=(
            f"Real dump sets ({', '.join(r['per_set'])}: the NCCL set has 16 ranks, the gloo "
            "sets 4 and 8) with one seq id of "
            "one non-culprit rank corrupted, still a valid pickle, read and analysed as "
            "`faultlens analyze-hang` does; the verdict (kind, culprit ranks) against the "
            "intact set's. Named: the dump refused naming it, or a contradiction with its "
            "group noted."
        ),
        commands=(
            f"PYTHONPATH=. python -m bench.bench_seq_flips --family {r['family']} "
            f"--n {args.n} --seed {args.seed} --sets {args.sets} --write",
        ),
        figures=(
            Figure(
                f"{r['mutants']:,} mutants: verdicts changed (mutated rank added, innocent "
                "ranks added, a real culprit dropped)",
                f"{r['changed']} ({r['adds_mutated']}, {r['adds_innocent']}, {r['drops_culprit']})",
                "0",
                commit=commit,
                date=date,
            ),
            Figure(
                "mutants named (refused or contradiction noted); changed with no note",
                f"{r['named']:,}; {r['silent_changes']}",
                "every change named; 0",
                commit=commit,
                date=date,
            ),
            Figure(
                "changed verdicts that are the set's verdict without that rank's dump",
                f"{r['as_missing']} of {r['changed']}",
                "all (a refused dump is a missing one)",
                commit=commit,
                date=date,
            ),
            Figure(
                "changed verdicts at failover confidence (>= 0.6, rules/policy.yaml)",
                f"{r['changed_confident']}",
                "0",
                commit=commit,
                date=date,
            ),
            Figure("CPU for the whole run", f"{r['cpu_s']} s", commit=commit, date=date),
        ),
        notes=(
            f"Shared 2-core machine at load {load}: CPU seconds. Per set (mutants, changed, "
            "named): "
            + "; ".join(
                f"{k} {v['mutants']}/{v['changed']}/{v['named']}" for k, v in r["per_set"].items()
            )
            + ".",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("bit", "byte"), default="bit")
    parser.add_argument("--n", type=int, default=150, help="mutants drawn (0: all)")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--sets", default="nccl", help="nccl, gloo, or both (comma-separated)")
    parser.add_argument("--write", action="store_true", help="publish in docs/benchmarks.md")
    parser.add_argument("--show", action="store_true", help="print every changed verdict")
    args = parser.parse_args(argv)
    chosen: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for name in args.sets.split(","):
        chosen.update(SETS if name == "nccl" else gloo_sets() if name == "gloo" else {})
    load = f"{os.getloadavg()[0]:.0f}"
    result = run(chosen, args.family, args.n, args.seed)
    shown = result if args.show else {k: v for k, v in result.items() if k != "changed_cases"}
    print(json.dumps(shown, indent=1))
    if args.write:
        from bench.common import write_section

        write_section(REPO / "docs" / "benchmarks.md", _section(result, args, load))
    return 0 if result["changed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
