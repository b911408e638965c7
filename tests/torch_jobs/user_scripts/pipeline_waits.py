"""A hand-written 2-stage pipeline with 2 data-parallel replicas (4 ranks: rank r is replica r // 2,
stage r % 2). The user times the waits for the neighbour as `wait_act` (stage 1 waiting for
activations) and `wait_grad` (stage 0 waiting for gradients), the loss all_reduce as `comm/loss`
and the gradient all_reduce as `comm/grads`.

SLOW_RANK / SLOW_S (environment): that rank sleeps SLOW_S more in its forward every step. STEPS:
training steps (default 40), the job's
declared length; EXIT_INTERVAL: stop after that many steps (as Megatron's --exit-interval)."""

import os
import time

import torch
import torch.distributed as dist

from faultlens.collectors.training.step_timer import ParallelCoords, StepTimer

MICROBATCHES = 2
WIDTH = 64


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    replica, stage = divmod(rank, 2)
    steps = int(os.environ.get("STEPS", "40"))
    exit_interval = int(os.environ.get("EXIT_INTERVAL", str(steps)))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_S", "0.03"))
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    dp_group = dp_groups[stage]
    peer = rank + 1 if stage == 0 else rank - 1

    torch.manual_seed(stage)
    layer = torch.nn.Linear(WIDTH, WIDTH)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    timer = StepTimer.from_env(
        parallel=ParallelCoords(dp_rank=replica, pp_rank=stage, pp_size=2), total_steps=steps
    )
    with timer:
        for step in range(min(steps, exit_interval)):
            with timer.step(step):
                outputs = []
                for _ in range(MICROBATCHES):
                    if stage == 0:
                        x = torch.randn(16, WIDTH)
                    else:
                        x = torch.empty(16, WIDTH)
                        with timer.section("wait_act"):
                            dist.recv(x, src=peer)
                        x.requires_grad_(True)
                    with timer.section("forward"):
                        time.sleep(0.008)
                        if rank == slow_rank:
                            time.sleep(slow_s / MICROBATCHES)
                        y = torch.tanh(layer(x))
                    if stage == 0:
                        dist.send(y.detach(), dst=peer)
                    outputs.append((x, y))
                total = torch.zeros(1)
                for x, y in reversed(outputs):
                    if stage == 1:
                        with timer.section("backward"):
                            loss = y.pow(2).mean()
                            loss.backward()
                            total += loss.detach()
                        dist.send(x.grad, dst=peer)
                    else:
                        grad = torch.empty_like(y)
                        with timer.section("wait_grad"):
                            dist.recv(grad, src=peer)
                        with timer.section("backward"):
                            y.backward(grad)
                with timer.section("comm/loss"):
                    dist.all_reduce(total)
                with timer.section("comm/grads"):
                    for p in layer.parameters():
                        dist.all_reduce(p.grad, group=dp_group)
                with timer.section("optimizer"):
                    opt.step()
                    opt.zero_grad()
            if rank == 1 and step % 10 == 0:
                print(f"step {step} loss {total.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
