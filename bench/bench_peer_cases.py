"""The peers' own test cases, scored: GPUd's, NVSentinel's and GCM's kernel-log cases (the lines and
expected answers tests/test_kmsg_peers.py ports) and the completed-mismatch gloo sets
(tests/data/completed-mismatch) beside torch's flight-recorder analyzer, run here on the same dumps.
Writes its section of docs/benchmarks.md (--no-docs: print only).

    PYTHONPATH=. python bench/bench_peer_cases.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import Figure, Section, emit, machine, write_section  # noqa: E402
from faultlens.attribution.detectors.hang import HangVerdict, analyze_collectives  # noqa: E402
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir  # noqa: E402
from faultlens.collectors.sources.kmsg import KernelLogParser  # noqa: E402
from faultlens.collectors.sources.xid_catalog import load_xid_catalog  # noqa: E402
from tests import test_kmsg_peers as peers  # noqa: E402

SECTION = "Peer test cases: kernel-log readers and completed mismatches"
MISMATCH = REPO / "tests" / "data" / "completed-mismatch"
SKIPS = REPO / "tests" / "data" / "skip-before-history"


def _events(lines: list[str]) -> list:
    return KernelLogParser(tz=dt.UTC, now=lambda: peers.NOW).feed_lines(lines)


def kernel_log() -> dict[str, tuple[int, int]]:
    """suite -> (cases faultlens answers as the peer expects (or as NVIDIA, where the peer
    differs), cases)."""
    catalog = load_xid_catalog()
    out: dict[str, tuple[int, int]] = {}
    right = 0
    for line, code, pci in peers.GPUD_MATCH:
        events = _events([line])
        right += bool(events) and (events[0].code, events[0].pci_bus_id) == (code, pci)
    out["GPUd Xid lines"] = (right, len(peers.GPUD_MATCH))
    right = agree = 0
    for line, gpud, resolution, _severity in peers.GPUD_NVLINK5:
        code, message = line.split("): ", 1)[1].split(", ", 1)
        decoded = catalog.decode_nvlink5(int(code), message)
        right += decoded is not None and decoded.rule.resolution == resolution
        agree += (gpud == "fatal") == (resolution == "RESET_GPU")
    out["GPUd NVLink5 lines (NVIDIA's decode)"] = (right, len(peers.GPUD_NVLINK5))
    out["GPUd NVLink5: GPUd's own answer = NVIDIA's"] = (agree, len(peers.GPUD_NVLINK5))
    fallen = [
        [
            "NVRM: The NVIDIA GPU 0000:18:00.0",
            "NVRM: (PCI ID: 10de:2901) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        ],
        ["NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."],
        ["NVRM: GPU 18:00.0: GPU has fallen off the bus."],
    ]
    want = ["00000000:18:00.0", "00000000:29:00.0", "00000000:18:00.0"]
    right = sum(
        [(e.kind, e.pci_bus_id) for e in _events(lines)] == [("gpu_lost", pci)]
        for lines, pci in zip(fallen, want, strict=True)
    )
    out["GPUd fallen-off-the-bus forms"] = (right, len(fallen))
    block = peers._NVS_BLOCK
    nvs = [
        block,
        [*block, "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus."],
        [block[0], "               NVRM: Xid (PCI:0000:b3:00.0): 79", block[2]],
    ]
    right = sum(
        [e.pci_bus_id for e in _events(lines) if e.kind == "gpu_lost"] == ["00000000:B3:00.0"]
        for lines in nvs
    )
    out["NVSentinel fallen-off-the-bus fixtures (one loss each)"] = (right, len(nvs))
    gcm = _events(
        [
            "[Fri Oct 14 14:56:49 2022] NVRM: Xid (PCI:000d:00:00): 31, pid=3234, x",
            "[Fri Oct 14 14:56:49 2022] NVRM: Xid (PCI:000d:00:00): 48, pid=3234, y",
        ]
    )
    critical = [e.code for e in gcm if e.kind == "xid" and catalog.get(e.code).hardware]
    out["GCM Xid fixture (48 critical, 31 not)"] = (int(critical == [48]), 1)
    return out


def _torch_culprits(dumps: Path) -> set[int] | None:
    """The ranks torch's fr_trace prints as `Culprit rank N` (None where it fails on the set)."""
    with tempfile.TemporaryDirectory() as tmp:
        for path in dumps.glob("rank_*.pkl"):
            shutil.copyfile(path, Path(tmp) / f"_dump_{path.stem.split('_')[1]}")
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.flight_recorder.fr_trace",
                tmp,
                "-p",
                "_dump_",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    if result.returncode != 0:
        return None
    return {int(r) for r in re.findall(r"Culprit rank (\d+)", result.stdout + result.stderr)}


def completed_mismatches() -> dict[str, tuple[int, int, int]]:
    """form -> (faultlens exact, torch exact, torch failed) over the sets of that form."""
    out: dict[str, list[int]] = {}
    for truth_file in sorted(MISMATCH.glob("*/*/truth.json")):
        truth = json.loads(truth_file.read_text())
        dumps = truth_file.parent / "dumps"
        report = analyze_collectives(
            read_dump_dir(dumps).table, expected_ranks=range(truth["world_size"])
        )
        mine = (
            report.verdict == HangVerdict.COLLECTIVE_MISMATCH
            and list(report.culprit_ranks) == truth["odd_ranks"]
        )
        theirs = _torch_culprits(dumps)
        row = out.setdefault(truth_file.parent.parent.name, [0, 0, 0, 0])
        row[0] += mine
        row[1] += theirs == set(truth["odd_ranks"])
        row[2] += theirs is None
        row[3] += 1
    return {k: tuple(v) for k, v in out.items()}


def skip_before_history() -> dict[str, tuple[int, int, int, int]]:
    """'<form> <family>' -> (faultlens exact with no victim named, torch exact, torch failed,
    sets) over the skip-before-history sets (tests/test_hang_skip_history.py); the ranks' exits
    (who timed out waiting) are given to faultlens as the attribution engine gives them."""
    from tests import test_hang_skip_history as skips

    out: dict[str, list[int]] = {}
    for truth_file in sorted(SKIPS.glob("*/*/truth.json")):
        truth, report = skips.analyse(truth_file.parent, exits=True)
        exact = list(report.culprit_ranks) == truth["culprits"]
        mine = exact and not skips.named(report) & set(truth["victims"])
        theirs = _torch_culprits(truth_file.parent / "dumps")
        family = "send/recv pair" if truth["shape"] in skips.P2P else "collectives"
        row = out.setdefault(f"{truth_file.parent.parent.name} dumps, {family}", [0, 0, 0, 0])
        row[0] += mine
        row[1] += theirs == set(truth["culprits"])
        row[2] += theirs is None
        row[3] += 1
    return {k: tuple(v) for k, v in out.items()}


def torch_cases() -> tuple[int, int, int]:
    """PyTorch's test_match_one_event pairs (tests/test_hang_torch_cases.py): (faultlens answers as
    that test file expects, torch's match_one_event gives its own test's state, cases)."""
    from tests import test_hang_torch_cases as cases

    mine = theirs = 0
    for _case, change, torch_state, verdict, ranks in cases.CASES:
        pair = (cases.E1, {**cases.E1, **change})
        got = cases.utils.match_one_event(
            cases._torch_event(pair[0]), cases._torch_event(pair[1]), {"0": {0, 1}}, "0"
        ).state
        theirs += got == getattr(cases.types.MatchState, torch_state)
        with tempfile.TemporaryDirectory() as tmp:
            report = cases._faultlens(Path(tmp), pair)
        mine += (report.verdict, report.culprit_ranks) == (verdict, ranks)
    return mine, theirs, len(cases.CASES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    rev = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
        or "-"
    )
    date = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}"
    logs = kernel_log()
    mismatch = completed_mismatches()
    skips = skip_before_history()
    torch_mine, torch_theirs, torch_total = torch_cases()
    gpud_own = logs.pop("GPUd NVLink5: GPUd's own answer = NVIDIA's")
    figures = []
    for suite, (right, total) in logs.items():
        anchor = ratio = "-"
        if suite.startswith("GPUd NVLink5"):
            anchor = f"GPUd's own answer {gpud_own[0]}/{gpud_own[1]}"
            ratio = f"{right / gpud_own[0]:.2f}x"
        figures.append(
            Figure(
                f"{suite}: answered right",
                f"{right}/{total}",
                "every case",
                anchor,
                ratio,
                rev,
                date,
            )
        )
    for form, (mine, theirs, failed, total) in mismatch.items():
        figures.append(
            Figure(
                f"completed mismatches, {form} dumps: exact odd ranks, no hang",
                f"{mine}/{total}",
                "every set exact",
                f"torch fr_trace {theirs}/{total} exact ({failed} failed to run)",
                f"{mine / theirs:.1f}x" if theirs else "-",
                rev,
                date,
            )
        )
    for form, (mine, theirs, failed, total) in skips.items():
        figures.append(
            Figure(
                f"skip before history, {form}: the skipper alone, no waiter named",
                f"{mine}/{total}",
                "every set exact",
                f"torch fr_trace {theirs}/{total} exact ({failed} failed to run)",
                f"{mine / theirs:.1f}x" if theirs else "-",
                rev,
                date,
            )
        )
    figures.append(
        Figure(
            "PyTorch analyzer cases (test_match_one_event pairs as 2-rank dumps): expected answer",
            f"{torch_mine}/{torch_total}",
            "every case",
            f"torch match_one_event {torch_theirs}/{torch_total} (its own test's states)",
            "-",
            rev,
            date,
        )
    )
    section = Section(
        SECTION,
        "Compares: faultlens' kernel-log parser and Xid catalog on the peers' own test lines "
        "(GPUd's kmsg_test.go and nvlink_logs_test.go, NVSentinel's "
        "gpufallen_handler_test.go, GCM's test_check_syslogs.py: their expected answers, "
        "NVIDIA's decode where GPUd differs), and faultlens' hang analysis vs torch's "
        "flight-recorder analyzer on real gloo jobs whose mismatched collective every rank "
        "completed (tests/data/completed-mismatch) and on real gloo jobs in which one rank left "
        "out a sub-group's first collective or send and the others timed out "
        "(tests/data/skip-before-history).",
        ("PYTHONPATH=. python bench/bench_peer_cases.py",),
        tuple(figures),
        (
            "GPUd, NVSentinel and GCM do not run here: their columns are the answers their own "
            "tests expect. GPUd reads the four NVLink5 TLW pipe lines with errorStatus 0x4 as "
            "warnings; NVIDIA's decode sheet says Fatal, RESET_GPU, and faultlens follows NVIDIA.",
            "On torch's pairs faultlens names the rank still inside a collective its peer "
            "completed (torch: 'state mismatch', no rank), and both ranks of a one-against-one "
            "mismatch below the failover threshold (torch: one of them).",
            "torch's analyzer takes the first rank's entry as the expected one: on "
            "broadcast_shape_4 it names the three ranks that agree and not rank 3; on gloo's raw "
            "dumps (pg_config keyed '' with no ranks) it stops with a KeyError.",
            "Skip before history: gloo records no send/recv, so a left-out send leaves no trace "
            "in any dump: faultlens names the receiver (whose exit says it timed out waiting) "
            "below the failover threshold and cannot name the sender. The collective shapes (a "
            "pair group, chains through two and three sub-groups) name the skipper alone from "
            "repaired and raw dumps alike: where gloo's raw pg_config names no members, a short "
            "group is completed from its part (one desc, or a creation run of desc-less groups, "
            "split over the ranks: one short group takes the ranks outside, several the whole "
            "groups' offset pattern), and groups only their waiter recorded are tried with every "
            "member the ranks' local process-group ids allow (chain3_4: all 6 memberships name "
            "the skipper).",
            f"Machine: {machine()['cpu']}, {machine()['cores']} cores.",
        ),
    )
    if not args.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", section)
    emit(
        "peer_cases",
        {
            "commit": rev,
            "kernel_log": logs,
            "completed_mismatch": mismatch,
            "skip_before_history": skips,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
