"""The in-job numerics probe (collectors/training/numerics.py): its rows reach a real store through
the step timer's writer, its gradient norm is torch's, its digest changes with any one flipped bit
of any float dtype (and comes back when the bit flips back), and nothing it meets raises into the
training loop."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.training.numerics import NumericsProbe
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer
from faultlens.controller.lab.inject import flip_bit

torch = pytest.importorskip("torch")


def _timer(store: Path) -> StepTimer:
    identity = RankIdentity(rank=3, job_id="job", attempt=0, node="node-1", gpu_index=1)
    return StepTimer.from_env(str(store), identity=identity, heartbeat=False)


@pytest.mark.parametrize(("every", "norm_every"), [(1, 1), (3, 2), (5, 3)])
def test_rows_reach_the_store_with_torchs_gradient_norm_and_a_digest_every_n_steps(
    tmp_path: Path, every: int, norm_every: int
) -> None:
    torch.manual_seed(every)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = _timer(tmp_path / "store")
    probe = NumericsProbe(timer, digest_every=every, norm_every=norm_every)
    expected = {}
    for step in range(10):
        with timer.step(step) as record:
            loss = model(torch.randn(4, 6)).pow(2).mean()
            loss.backward()
            probe.local_grads(model.parameters())
            expected[step] = float(
                torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            )
            optimizer.step()
            optimizer.zero_grad()
            record.loss = loss.item()
        probe.record(step, loss=loss, module=model, batch=f"shard-{step}")
    timer.close()
    assert probe.stats.errors == 0 and timer.extra_dropped == {}
    with Store(str(tmp_path / "store")) as store:
        rows = store.query("SELECT * FROM numerics ORDER BY step").to_pylist()
    assert [r["step"] for r in rows] == list(range(10))
    assert all(r["rank"] == 3 and r["node"] == "node-1" and r["gpu_index"] == 1 for r in rows)
    for row in rows:
        if row["step"] % norm_every:
            assert row["grad_norm"] is None  # not this step: nothing gathered, nothing carried
            continue
        assert row["grad_norm"] == pytest.approx(expected[row["step"]], rel=1e-5)
        assert row["batch"] == f"shard-{row['step']}"
        assert (row["digest"] is not None) == (row["step"] % every == 0)
    digests = [r["digest"] for r in rows if r["digest"]]
    assert len(set(digests)) == len(digests)  # the parameters moved every step
    assert {r["digest_bytes"] for r in rows if r["digest"]} == {(6 * 5 + 5 + 5 * 2 + 2) * 4}


def test_the_local_norm_is_torchs_over_mixed_dtypes_sparse_and_missing_gradients() -> None:
    torch.manual_seed(1)
    dense = torch.nn.Linear(40, 30)
    half = torch.nn.Linear(30, 20).to(torch.bfloat16)
    wide = torch.nn.Linear(20, 3).double()
    embed = torch.nn.Embedding(50, 40, sparse=True)
    unused = torch.nn.Linear(3, 3)  # no gradient
    ids = torch.randint(0, 50, (16,))
    x = dense(embed(ids))
    x = half(x.to(torch.bfloat16)).float()
    wide(x.double()).pow(2).mean().backward()
    params = [*embed.parameters(), *dense.parameters(), *half.parameters(), *wide.parameters()]
    params += list(unused.parameters())
    expected = sum(
        float(torch.linalg.vector_norm(p.grad.coalesce().values() if p.grad.is_sparse else p.grad,
                                       dtype=torch.float64)) ** 2
        for p in params
        if p.grad is not None
    ) ** 0.5

    class Rows:
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def queue_row(self, table: str, row: dict) -> None:
            self.rows.append(row)

    sink = Rows()
    probe = NumericsProbe(sink, digest_every=0)
    probe.local_grads(params)
    probe.record(0)
    assert probe.stats.errors == 0, probe.stats.last_error
    assert sink.rows[-1]["grad_norm"] == pytest.approx(expected, rel=1e-3)  # bfloat16 terms


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("hasher", ["crc32", "blake2b"])
def test_any_one_flipped_bit_changes_the_digest(dtype: str, hasher: str) -> None:
    rng = random.Random(f"{dtype}-{hasher}")
    torch.manual_seed(0)
    shapes = [(33, 17), (64,), (3, 4, 5), ()]
    params = [torch.randn(s).to(getattr(torch, dtype)) for s in shapes]
    probe = NumericsProbe(None, hasher=hasher)
    clean = probe.digest(params)[0]
    assert probe.digest([p.clone() for p in params])[0] == clean
    width = 8 * params[0].element_size()
    for _ in range(40):
        tensor = rng.choice(params)
        index, bit = rng.randrange(max(1, tensor.numel())), rng.randrange(width)
        flip_bit(tensor, index, bit)
        assert probe.digest(params)[0] != clean, (tensor.shape, index, bit)
        flip_bit(tensor, index, bit)
        assert probe.digest(params)[0] == clean


def test_nothing_raises_into_the_training_loop(tmp_path: Path) -> None:
    class Broken:
        def parameters(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("no parameters today")

    timer = _timer(tmp_path / "store")
    probe = NumericsProbe(timer, digest_every=1)
    probe.local_grads([object(), None])  # no .grad: nothing to add
    probe.local_grads(Broken().parameters)  # not iterable: counted
    probe.record(0, loss="not a number", module=Broken())
    probe.record(1, loss=float("nan"))
    timer.close()
    probe.record(2, loss=1.0)  # after close: counted as dropped, not raised
    assert probe.stats.errors == 2
    assert timer.extra_dropped == {"numerics": 1}
    with Store(str(tmp_path / "store")) as store:
        rows = store.query("SELECT step, loss FROM numerics ORDER BY step").to_pylist()
    assert [r["step"] for r in rows] == [1]
    with pytest.raises(ValueError):
        NumericsProbe(timer, hasher="no-such-hash")


def test_the_first_row_and_the_first_non_finite_one_reach_the_store_at_once(
    tmp_path: Path,
) -> None:
    # the timer flushes once an hour here: only the probe's own flushes write anything before close
    identity = RankIdentity(rank=1, job_id="job", attempt=0, node="node-0", gpu_index=0)
    timer = StepTimer.from_env(
        str(tmp_path / "store"), identity=identity, heartbeat=False, flush_interval_s=3600.0
    )
    probe = NumericsProbe(timer, digest_every=0)

    def stored() -> list[int]:
        if not (tmp_path / "store" / "numerics").exists():
            return []
        with Store(str(tmp_path / "store")) as store:
            return [r["step"] for r in store.query("SELECT step FROM numerics").to_pylist()]

    def wait_for(step: int) -> list[int]:
        for _ in range(100):
            steps = stored()
            if step in steps:
                return steps
            time.sleep(0.05)
        return stored()

    losses = [1.0, 0.9, 0.8, float("inf"), float("nan"), float("nan")]
    probe.record(0, loss=losses[0])
    assert wait_for(0) == [0]
    for step in (1, 2):
        probe.record(step, loss=losses[step])
    assert probe.stats.urgent_flushes == 1  # finite rows wait for the timer's flush
    probe.record(3, loss=losses[3])  # the first loss that is not finite: written at once
    assert sorted(wait_for(3)) == [0, 1, 2, 3]
    for step in (4, 5):
        probe.record(step, loss=losses[step])
    assert probe.stats.urgent_flushes == 2  # once, not at every bad step
    timer.close()
    assert sorted(stored()) == list(range(6))
