"""The skip-before-history family (tests/torch_jobs/skip_history): real gloo jobs in which one rank
leaves out the first collective of a sub-group (or the first send of a send/recv pair) and goes on,
before that group has any history on it. Its partner waits there until gloo's timeout; in a chain
the partner's own sub-group peers wait on it in a second and a third sub-group; every other rank
waits in the world collective. Each rank dumps in its timeout's exception handler, in torch's raw
form (gloo's pg_config keyed '' with no ranks) and faultlens' repaired one, at 4 and 8 ranks
(tests/data/skip-before-history, made by tests/torch_jobs/skip_history/generate.py).

Every set: the skipper named alone, never a rank that only waited; every waiter a follow-on. From
raw dumps too: membership the entries leave out is completed from the group's part (one desc or a
creation run, split over the ranks) or tried in every form the ranks' local process-group ids allow
(tests/test_hang_raw_membership.py). A skipped send leaves no trace gloo records: there no waiter
is named at the failover threshold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from faultlens.attribution.detectors.hang import HangReport, HangVerdict, analyze_collectives
from faultlens.attribution.policy.config import load_policy
from faultlens.attribution.rules import load_crash_rules
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from tests.conftest import DATA_DIR
from tests.torch_jobs.skip_history.shapes import BY_NAME, FORMS, SHAPES

ROOT = DATA_DIR / "skip-before-history"
SETS = sorted(ROOT.glob("*/*/truth.json"))
THRESHOLD = load_policy().confidence_threshold
#: gloo records no send/recv: a skipped send leaves no trace in any dump
P2P = {s.name for s in SHAPES if any(op == "send_up" for _, op in s.program)}
#: sets whose dumps cannot name the skipper, and why (there no rank is named at the failover
#: threshold: test_no_waiter_is_a_cause_where_the_dumps_cannot_tell)
LIMITS = {
    **{
        f"{form}/{name}": "gloo records no send/recv, and nothing of the pair group: only the "
        "receiver's exit (timed out waiting) says it waited, not on whom"
        for form in FORMS
        for name in P2P
    },
}


def key(truth_file: Path) -> str:
    return f"{truth_file.parent.parent.name}/{truth_file.parent.name}"


def timed_out(shape: str) -> set[int]:
    """The ranks whose own exception says they waited: a collective's timeout, or the echo of a
    peer's failure (rules/crash.yaml), as the attribution engine passes them from the ranks'
    exits (progress/dumps.py waiting_ranks)."""
    rules = load_crash_rules()
    waited = [re.compile(p) for p in (*rules.timeout_patterns, *rules.secondary_patterns)]
    stopped = [re.compile(p) for p in rules.termination_patterns]
    out = set()
    for path in (ROOT / shape / "errors").glob("rank_*.txt"):
        text = path.read_text()
        if any(p.search(text) for p in waited) and not any(p.search(text) for p in stopped):
            out.add(int(path.stem.split("_")[1]))
    return out


def analyse(directory: Path, exits: bool = False) -> tuple[dict, HangReport]:
    truth = json.loads((directory / "truth.json").read_text())
    report = analyze_collectives(
        read_dump_dir(directory / "dumps").table,
        expected_ranks=range(truth["world_size"]),
        timed_out=timed_out(truth["shape"]) if exits else (),
    )
    return truth, report


def named(report: HangReport) -> set[int]:
    return set(report.culprit_ranks) | {r for root in report.roots for r in root.ranks}


def test_every_set_is_a_shape_in_both_forms_and_every_family_is_there() -> None:
    made = {(p.parent.parent.name, p.parent.name) for p in SETS}
    shapes = {name for _, name in made}
    assert made == {(form, name) for form in FORMS for name in shapes}
    assert shapes <= set(BY_NAME)
    assert {name.rsplit("_", 1)[0] for name in shapes} == {"pair", "pair_p2p", "chain2", "chain3"}
    for name in shapes:
        truth = json.loads((ROOT / "raw" / name / "truth.json").read_text())
        assert truth == BY_NAME[name].truth()


@pytest.mark.parametrize(
    "truth_file", [p for p in SETS if key(p) not in LIMITS], ids=key
)
@pytest.mark.parametrize("exits", [False, True], ids=["dumps", "dumps+exits"])
def test_the_skipper_alone_is_named(truth_file: Path, exits: bool) -> None:
    truth, report = analyse(truth_file.parent, exits)
    assert list(report.culprit_ranks) == truth["culprits"], report.reason
    assert not named(report) & set(truth["victims"]), report.reason
    assert report.verdict == HangVerdict.NEVER_JOINED
    (root,) = report.roots
    assert root.kind == HangVerdict.SKIPPED, report.reason
    assert set(root.waiting_ranks) == set(truth["victims"])
    assert set(report.follow_ons) == set(truth["victims"])


@pytest.mark.parametrize("truth_file", [p for p in SETS if key(p) in LIMITS], ids=key)
def test_no_waiter_is_a_cause_where_the_dumps_cannot_tell(truth_file: Path) -> None:
    """What LIMITS lists: the ranks that only waited may be named, each below the failover
    threshold with the reason it may be waiting (given the ranks' exits, as the engine gives
    them)."""
    truth, report = analyse(truth_file.parent, exits=True)
    assert report.roots
    for root in report.roots:
        if set(root.ranks) & set(truth["victims"]):
            assert root.confidence < THRESHOLD, report.reason
            assert any(line.startswith("uncertain: ") for line in root.evidence), root.evidence
    assert report.confidence < THRESHOLD


def test_the_job_still_makes_the_committed_answer(tmp_path: Path) -> None:
    """A pair skip made anew by a real 4-rank gloo job: the same answer as the committed set, in
    both forms (the committed sets are what this torch writes); ~20 s of wall time, most of it the
    15 s collective timeout."""
    pytest.importorskip("torch")
    from tests.torch_jobs.skip_history.generate import generate_shape

    generate_shape(BY_NAME["pair_4"], tmp_path)
    for form in FORMS:
        truth, report = analyse(tmp_path / form / "pair_4")
        assert list(report.culprit_ranks) == truth["culprits"] == [1], report.reason
        assert set(report.follow_ons) == {0, 2, 3}


@pytest.mark.parametrize("form", FORMS)
def test_what_a_skipped_send_leaves_and_what_is_said_of_it(form: str) -> None:
    """pair_p2p_4: rank 2 leaves out its send to rank 3 (pair [2, 3]) and goes on.

    What the dumps show: no rank recorded the send/recv (gloo records none) nor anything of the pair
    group; rank 3's last entry is the world all_reduce its peers completed, and it never entered the
    next one, where every other rank (the skipper among them) waits. The repaired pg_config names
    the pair group on ranks 2 and 3 (a group a rank belongs to though nothing of it was recorded).
    What they cannot show: that rank 3 waits in a recv, on whom, or that rank 2 skipped anything:
    rank 3's dump is that of a rank stuck in its own code. Only rank 3's exit ("Timed out waiting
    ... recv") says it waited. So the skipper is not named, and the receiver, a waiter, is named
    only below the failover threshold, with the reason it may be waiting."""
    import pickle

    directory = ROOT / form / "pair_p2p_4"
    dumps = {r: pickle.loads((directory / "dumps" / f"rank_{r}.pkl").read_bytes())
             for r in range(4)}
    assert not any(e["is_p2p"] or e["process_group"][1] != "default_pg"
                   for d in dumps.values() for e in d["entries"])
    if form == "repaired":
        for r in (2, 3):
            assert [v["ranks"] for v in dumps[r]["pg_config"].values()
                    if v["desc"] == "pair"] == ["[2, 3]"]
    _, report = analyse(directory, exits=True)
    assert 2 not in report.culprit_ranks
    (root,) = report.roots
    assert root.ranks == (3,) and root.confidence < THRESHOLD, report.reason
    assert any(line.startswith("uncertain: ") and "timed out waiting" in line
               for line in root.evidence), root.evidence
