"""Runs scenarios one after another and scores each as it ends; results are written as they come
(<out>/results.jsonl, one scored scenario a line), so a campaign cut short still has its table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from faultlens.controller.lab.runner import load_artifacts, run_scenario
from faultlens.controller.lab.scenarios import Campaign, Scenario
from faultlens.controller.lab.score import ScenarioScore, score, summarize


def run_campaign(campaign: Campaign, scenarios: Sequence[Scenario], out_dir: Path, *,
                 on_score: Callable[[ScenarioScore], None] | None = None,
                 deadline_s: float | None = None, resume: bool = False
                 ) -> tuple[list[ScenarioScore], dict[str, Any]]:
    """Run and score `scenarios`; stop starting new ones past `deadline_s` (those are listed as not
    run). With `resume`, a scenario that already has a finished run under `out_dir` is scored from
    it, not run again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    results.write_text("")
    started = time.monotonic()
    scores: list[ScenarioScore] = []
    skipped: list[str] = []
    for scenario in scenarios:
        done = out_dir / scenario.name / "artifacts.json"
        if resume and done.exists():
            art = load_artifacts(done.parent)
        elif deadline_s is not None and time.monotonic() - started > deadline_s:
            skipped.append(scenario.name)
            continue
        else:
            art = run_scenario(scenario, out_dir, dict(campaign.gpu_timelines))
        result = score(scenario, art)
        scores.append(result)
        with results.open("a") as handle:
            handle.write(json.dumps(result.to_dict(), default=str) + "\n")
        if on_score is not None:
            on_score(result)
    summary = {
        **summarize(scores),
        "not_run": skipped,
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return scores, summary


def interleave(scenarios: Sequence[Scenario]) -> list[Scenario]:
    """Healthy and faulty scenarios alternated (each in file order), so a campaign cut short by its
    deadline still has both kinds."""
    healthy = [s for s in scenarios if s.truth.healthy]
    faulty = [s for s in scenarios if not s.truth.healthy]
    ratio = max(1, round(len(faulty) / max(1, len(healthy))))
    out: list[Scenario] = []
    while healthy or faulty:
        out.extend(faulty[:ratio])
        del faulty[:ratio]
        if healthy:
            out.append(healthy.pop(0))
    return out
