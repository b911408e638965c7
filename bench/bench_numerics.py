"""Cost of the in-job numerics signals (collectors/training/numerics.py) on the training thread,
beside the bare step of a >= 100M-parameter model on the CPU, and the store volume they write.

    PYTHONPATH=. python -m bench.bench_numerics [--width 3200] [--layers 10] [--steps 3] [--write]
    PYTHONPATH=. python -m bench.bench_numerics --detection [--seeds 5] [--only WORD,...] [--write]

- bare step: forward, backward and an SGD step of an MLP of `layers` Linear(width, width) layers
  (10 x 3200: 102M parameters, 410 MB float32) on a batch of 8, no instrumentation.
- per step: the local gradient norm (NumericsProbe.local_grads, the sum of squares of every
  gradient) and the row (NumericsProbe.record without a digest), beside the bare step.
- per digest: NumericsProbe.digest over the parameters: CRC-32 (zlib, the default) against the
  hashlib digests a user would pick (blake2b, sha256), bytes hashed per second, same run.
- store volume: the numerics rows of one rank for a simulated day at one step a second and a
  digest every 100 steps, written through a SegmentSink into Parquet, bytes per rank-day.
`--detection` runs real DDP jobs (tests/numerics_jobs.py: gloo on the CPU, the campaign's script
and injector) per corruption type and per healthy look-alike, and judges each with the batch pass
and the decision policy: detected, rank exact, the steps and seconds from the flip to the signal
that proves it, the restore step against the flip, false incidents. `--write` puts the sections
into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import Figure, Section, emit, machine, write_section

TITLE = "Numerics signals: cost on the training thread and store volume"
DETECTION_TITLE = "Silent data corruption: detection per injected type on real DDP jobs"


def _model(width: int, layers: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks)


def _best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


class _Rows:
    """A timer stand-in that only queues (the writer thread's work is off the training thread)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def queue_row(self, table: str, row: dict) -> None:
        self.rows.append(row)


def measure(width: int, layers: int, steps: int) -> dict:
    import torch

    from faultlens.collectors.training.numerics import NumericsProbe

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = _model(width, layers)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(8, width)

    def bare() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        optimizer.step()

    bare()  # warm
    step_s = _best(bare, steps)
    probe = NumericsProbe(_Rows(), digest_every=0)
    norm_s = _best(lambda: probe.local_grads(model.parameters()), steps)
    record_s = _best(lambda: probe.record(1, loss=1.0), 50)
    hashers = {}
    for name in ("crc32", "blake2b", "sha256"):
        p = NumericsProbe(_Rows(), hasher=name)
        size = p.digest(model)[1]
        hashers[name] = (_best(lambda p=p: p.digest(model), steps), size)
    return {
        "params": params,
        "step_s": step_s,
        "norm_s": norm_s,
        "record_s": record_s,
        "hashers": hashers,
    }


def store_volume(steps: int = 86_400, digest_every: int = 100) -> dict:
    import random

    from faultlens.collectors.store.sink import SegmentSink

    rng = random.Random(0)  # noisy values, as a real loss and gradient norm are (no easy runs)
    start = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1e9)
    with tempfile.TemporaryDirectory() as root:
        sink = SegmentSink(root, flush_rows=20_000, flush_age_s=3600.0)
        identity = {
            "cluster": "c",
            "node": "node-0",
            "job_id": "job",
            "attempt": 0,
            "rank": 0,
            "local_rank": 0,
            "gpu_index": 0,
            "gpu_uuid": "GPU-0",
            "pci_bus_id": None,
        }
        rows = []
        for step in range(steps):
            row = {
                **identity,
                "ts": start + step * 1_000_000_000,
                "step": step,
                "phase": "train",
                "loss": 2.0 + 1.0 / (1 + step) + rng.gauss(0.0, 0.05),
                "grad_norm": abs(rng.gauss(1.0, 0.2)),
                "dp_rank": 0,
                "tp_rank": 0,
                "pp_rank": 0,
                "batch": str(step),
            }
            if step % digest_every == 0:
                row.update(
                    digest=f"crc32:{(step * 2654435761) & 0xFFFFFFFF:08x}",
                    digest_bytes=410_000_000,
                    digest_s=0.5,
                )
            rows.append(row)
            if len(rows) == 20_000:
                sink.write("numerics", rows)
                rows = []
        if rows:
            sink.write("numerics", rows)
        sink.flush()
        size = sum(f.stat().st_size for f in Path(root).rglob("*.parquet"))
    return {"rows": steps, "bytes": size}


def detection(seeds: int, only: tuple[str, ...] = ()) -> dict:
    """Every case: (type, seed, world, faults, expect rank or None) run, judged, decided."""
    from faultlens.attribution.engine import attribute
    from faultlens.attribution.policy import DecisionPolicy, load_policy
    from faultlens.attribution.reading.store import Store
    from faultlens.controller.lab.plan import FaultSpec
    from faultlens.controller.restore import plan_restore, write_plan
    from tests.numerics_jobs import catalog, injected, train

    def numerics(found: list) -> list:  # no supervisor here: see tests/test_numerics_jobs.py
        return [i for i in found if i.incident_class.value == "numerics"]

    def flip(target: str, rank: int, step: int, bit: int, until: int | None = None) -> FaultSpec:
        return FaultSpec(
            id="flip",
            kind="bitflip",
            step=step,
            rank=rank,
            until_step=until,
            params={
                "target": target,
                "bit": bit,
                "param": 2 if target == "grad" else 0,
                "index": 7 * step,
            },
        )

    faulty = [
        ("parameter, mantissa bit 22, once", 3, lambda k: flip("param", k % 3, 6 + k, 22)),
        ("parameter, exponent bit 26, once", 3, lambda k: flip("param", (k + 1) % 3, 7 + k, 26)),
        (
            "parameter, exponent bit 30 (NaN), once",
            3,
            lambda k: flip("param", (k + 2) % 3, 9 + k, 30),
        ),
        (
            "gradient, exponent bit 30, 3 steps in a row",
            2,
            lambda k: flip("grad", k % 2, 8 + k, 30, 11 + k),
        ),
    ]
    healthy = [
        ("healthy", 2, lambda k: None),
        (
            "bad batch on every rank (back to normal)",
            2,
            lambda k: FaultSpec(
                id="batch", kind="loss_spike", step=10 + k % 4, params={"factor": 100.0 * (k + 1)}
            ),
        ),
        ("one gradient flip once (an observation)", 2, lambda k: flip("grad", k % 2, 8 + k, 30)),
    ]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, world, make in faulty + healthy:
            if only and not any(word in kind for word in only):
                continue
            for k in range(seeds if (kind, world, make) in healthy else max(1, seeds - 3)):
                root = Path(tmp) / f"{len(results)}-{k}"
                job = f"job{k}"
                fault = make(k)
                train(root, job, world, (fault,) if fault else (), seed=k, batch=16 + 8 * k)
                shot = [r for r in injected(root) if r["attempt"] == 0]
                with Store(str(root / "store")) as store:
                    found = numerics(attribute(store))
                row: dict = {"incidents": len(found), "fault": fault is not None}
                if fault is not None and found:
                    incident = found[0]
                    nodes = [f"node-{r}" for r in range(world)]
                    chooser = catalog(root, job, nodes)
                    decision = DecisionPolicy(load_policy(), restore_chooser=chooser).decide(
                        incident, job_nodes=nodes
                    )
                    signal_step = int(incident.details.get("mismatch_step", incident.step))
                    row.update(
                        rule=incident.rule,
                        ranks=list(incident.culprit_ranks),
                        rank_exact=list(incident.culprit_ranks) == [fault.rank],
                        steps_to_signal=signal_step - fault.step,
                        s_to_signal=incident.first_signal_ts.timestamp() - shot[0]["ts"]
                        if shot
                        else None,
                        action=decision.action.value,
                        restore=decision.restore.step if decision.restore else None,
                        restore_before=decision.restore is not None
                        and decision.restore.step < fault.step,
                    )
                    plan = plan_restore(decision, chooser, world_size=world)
                    if plan is not None and plan.step is not None:  # the resumed job: healthy
                        write_plan(plan, root / "plan.json")
                        spare = [
                            n if n not in decision.exclude_nodes else f"spare-{n}" for n in nodes
                        ]
                        train(
                            root,
                            job,
                            world,
                            (fault,),
                            attempt=1,
                            nodes=spare,
                            plan=root / "plan.json",
                            seed=k,
                            batch=16 + 8 * k,
                        )
                        with Store(str(root / "store")) as store:
                            later = [i for i in numerics(attribute(store)) if i.attempt == 1]
                        results.setdefault("resumed after the rollback", []).append(
                            {"incidents": len(later), "fault": False}
                        )
                results.setdefault(kind, []).append(row)
                emit("numerics-detection", {"type": kind, "seed": k, **row})
    return results


def _detection_section(results: dict, commit: str, date: str) -> Section:
    figures = []
    for kind, rows in results.items():
        if rows and rows[0]["fault"]:
            hits = [r for r in rows if r.get("rule")]
            exact = sum(1 for r in hits if r["rank_exact"])
            before = sum(1 for r in hits if r["restore_before"])
            steps = sorted(r["steps_to_signal"] for r in hits)
            secs = sorted(r["s_to_signal"] for r in hits if r["s_to_signal"] is not None)
            rules = sorted({r["rule"] for r in hits})
            actions = sorted({r["action"] for r in hits})
            value = (
                f"detected {len(hits)}/{len(rows)}, rank exact {exact}/{len(rows)}, "
                f"restore before the flip {before}/{len(hits)}; flip to signal "
                f"{steps[0] if steps else '-'}-{steps[-1] if steps else '-'} steps, "
                f"{secs[0] if secs else 0:.1f}-{secs[-1] if secs else 0:.1f} s; "
                f"{', '.join(rules)} -> {', '.join(actions)}"
            )
            figures.append(
                Figure(kind, value, "rank exact, restore before it", commit=commit, date=date)
            )
        else:
            false = sum(r["incidents"] for r in rows)
            figures.append(
                Figure(
                    f"{kind}: false incidents",
                    f"{false} in {len(rows)} runs",
                    "0",
                    commit=commit,
                    date=date,
                )
            )
    healthy_runs = sum(len(rows) for rows in results.values() if rows and not rows[0]["fault"])
    return Section(
        DETECTION_TITLE,
        "faultlens numerics signals and judge per injected corruption type (no peer tool names "
        "the rank of a silent corruption: the anchor is the truth injected).",
        ("PYTHONPATH=. python -m bench.bench_numerics --detection --write",),
        tuple(figures),
        (
            f"{healthy_runs} healthy runs in all (look-alikes and resumed jobs). DDP MLP "
            "over gloo, 2 or 3 ranks (one a node), 24 steps, digest every 4 steps; seeds, batch "
            "sizes, steps, ranks and bits vary per run. Flip to signal: the step of the evidence "
            "(digest mismatch, outlier, non-finite loss) less the flip's step; seconds from the "
            "injection to that signal's row.",
        ),
    )


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=3200)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--detection", action="store_true", help="the detection runs instead")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--only", default="", help="the types whose name holds one of these comma-separated words"
    )
    args = parser.parse_args()
    if args.detection:
        results = detection(args.seeds, tuple(w for w in args.only.split(",") if w))
        if args.write:
            date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
            write_section(
                Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md",
                _detection_section(results, _commit(), date),
            )
        return
    m = measure(args.width, args.layers, args.steps)
    volume = store_volume()
    result = {**m, "volume": volume, "machine": machine()}
    emit("numerics", result)
    if not args.write:
        return
    commit, date = _commit(), dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    step_ms = m["step_s"] * 1e3
    crc_s, size = m["hashers"]["crc32"]
    figures = [
        Figure(
            "bare training step (forward, backward, SGD; batch 8)",
            f"{step_ms:.0f} ms",
            commit=commit,
            date=date,
        ),
        Figure(
            "local gradient norm per step (training thread)",
            f"{m['norm_s'] * 1e3:.1f} ms",
            "< 5% of the step",
            f"bare step {step_ms:.0f} ms",
            f"{m['norm_s'] / m['step_s'] * 100:.1f}% of the step",
            commit,
            date,
        ),
        Figure(
            "numerics row per step (training thread)",
            f"{m['record_s'] * 1e6:.1f} µs",
            commit=commit,
            date=date,
        ),
    ]
    for name in ("blake2b", "sha256"):
        other_s, _ = m["hashers"][name]
        figures.append(
            Figure(
                f"parameter digest, {size / 1e6:.0f} MB ({m['params'] / 1e6:.0f}M parameters)",
                f"crc32 {crc_s:.2f} s ({size / crc_s / 1e9:.2f} GB/s)",
                "-",
                f"hashlib {name} {other_s:.2f} s ({size / other_s / 1e9:.2f} GB/s)",
                f"{other_s / crc_s:.2f}x",
                commit,
                date,
            )
        )
    figures.append(
        Figure(
            "digest every 100 steps, per step (training thread)",
            f"{crc_s / 100 * 1e3:.1f} ms",
            "< 5% of the step",
            f"bare step {step_ms:.0f} ms",
            f"{crc_s / 100 / m['step_s'] * 100:.1f}% of the step",
            commit,
            date,
        )
    )
    figures.append(
        Figure(
            "store volume per rank-day (1 step/s, a digest every 100 steps)",
            f"{volume['bytes'] / 1e6:.2f} MB ({volume['bytes'] / volume['rows']:.1f} B/row)",
            commit=commit,
            date=date,
        )
    )
    section = Section(
        TITLE,
        "faultlens NumericsProbe (CRC-32 digest) vs the bare step and hashlib's blake2b/sha256.",
        ("PYTHONPATH=. python -m bench.bench_numerics --write",),
        tuple(figures),
        (
            f"Measured on {machine()['cpu']} ({machine()['cores']} cores, shared with other work), "
            "best of the runs; the digest of a GPU tensor adds its copy to the host.",
        ),
    )
    write_section(Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md", section)


if __name__ == "__main__":
    main()
