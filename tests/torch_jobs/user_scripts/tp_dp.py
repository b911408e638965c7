"""Tensor parallel x data parallel with sub-groups (4 ranks: TP 2 x DP 2; the two ranks of a tensor-
parallel group on one node, rank = dp * 2 + tp). Each rank holds half of a column-then-row parallel
MLP; the row-parallel output is all_reduced inside the forward (`train/forward/tp-allreduce`, the
input gradient likewise in backward), the gradients across the replicas in `grads-all-reduce`.
Megatron-ish names under the user's own `train/` prefix.

SLOW_RANK / SLOW_S (environment): that rank sleeps SLOW_S more in its forward every step. STEPS:
training steps (default 40), the job's
declared length; EXIT_INTERVAL: stop after that many steps (as Megatron's --exit-interval)."""

import os
import time

import torch
import torch.distributed as dist

from faultlens.collectors.training.step_timer import ParallelCoords, StepTimer

WIDTH = 64


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dp, tp = divmod(rank, 2)
    steps = int(os.environ.get("STEPS", "40"))
    exit_interval = int(os.environ.get("EXIT_INTERVAL", str(steps)))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_S", "0.03"))
    tp_group, _ = dist.new_subgroups(group_size=2)  # {0, 1}, {2, 3}
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    dp_group = dp_groups[tp]

    torch.manual_seed(tp)
    w1 = torch.randn(WIDTH, WIDTH // 2, requires_grad=True)
    w2 = torch.randn(WIDTH // 2, WIDTH, requires_grad=True)
    opt = torch.optim.SGD([w1, w2], lr=1e-3)
    timer = StepTimer.from_env(parallel=ParallelCoords(dp_rank=dp, tp_rank=tp), total_steps=steps)
    torch.manual_seed(100 + dp)
    with timer:
        for step in range(min(steps, exit_interval)):
            with timer.step(step):
                x = torch.randn(32, WIDTH)
                with timer.section("train/forward"):
                    time.sleep(0.01)
                    if rank == slow_rank:
                        time.sleep(slow_s)
                    partial = torch.relu(x @ w1) @ w2
                    with timer.section("tp-allreduce"):
                        out = partial.detach().clone()
                        dist.all_reduce(out, group=tp_group)
                    out = partial + (out - partial.detach())
                with timer.section("train/backward"):
                    time.sleep(0.01)
                    loss = out.pow(2).mean()
                    loss.backward()
                with timer.section("grads-all-reduce"):
                    for w in (w1, w2):
                        dist.all_reduce(w.grad, group=dp_group)
                with timer.section("train/optimizer"):
                    opt.step()
                    opt.zero_grad()
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
