"""A 2-stage x 2-replica pipeline timed the way a Megatron user times it: Megatron's timer names
(`forward-backward` around the schedule, inside it `batch-generator`, `forward-recv`,
`forward-compute`, `forward-send`, `backward-recv`, `backward-compute`, `backward-send`; then
`all-grads-sync` and `optimizer`), and only every LOG_INTERVAL-th iteration timed, as Megatron logs
its timers at its log interval (the step rows are a sample). Megatron's rank order (pipeline stage
slowest): stage = rank // 2, replica = rank % 2, so each stage is one node and the activations cross
nodes.

STEPS: the job's length (declared to the step timer, default 200); EXIT_INTERVAL: stop after that
many iterations (Megatron's --exit-interval); LOG_INTERVAL (default 4); SLOW_RANK / SLOW_S: that
rank's forward-compute takes SLOW_S more every iteration."""

import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from faultlens.collectors.training.step_timer import ParallelCoords, StepTimer

MICROBATCHES = 2
WIDTH = 64


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stage, replica = divmod(rank, 2)
    steps = int(os.environ.get("STEPS", "200"))
    exit_interval = int(os.environ.get("EXIT_INTERVAL", str(steps)))
    log_interval = int(os.environ.get("LOG_INTERVAL", "4"))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_S", "0.03"))
    dp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_group = dp_groups[stage]
    peer = rank + 2 if stage == 0 else rank - 2

    torch.manual_seed(stage)
    layer = torch.nn.Linear(WIDTH, WIDTH)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    timer = StepTimer.from_env(
        parallel=ParallelCoords(dp_rank=replica, pp_rank=stage, pp_size=2), total_steps=steps
    )
    with timer:
        for iteration in range(min(steps, exit_interval)):
            logged = iteration % log_interval == 0

            def timed(name, _logged=logged):
                return timer.section(name) if _logged else nullcontext()

            with timer.step(iteration) if logged else nullcontext():
                with timed("forward-backward"):
                    outputs = []
                    for _ in range(MICROBATCHES):
                        if stage == 0:
                            with timed("batch-generator"):
                                x = torch.randn(16, WIDTH)
                        else:
                            x = torch.empty(16, WIDTH)
                            with timed("forward-recv"):
                                dist.recv(x, src=peer)
                            x.requires_grad_(True)
                        with timed("forward-compute"):
                            time.sleep(0.008)
                            if rank == slow_rank:
                                time.sleep(slow_s / MICROBATCHES)
                            y = torch.tanh(layer(x))
                        if stage == 0:
                            with timed("forward-send"):
                                dist.send(y.detach(), dst=peer)
                        outputs.append((x, y))
                    total = torch.zeros(1)
                    for x, y in reversed(outputs):
                        if stage == 1:
                            with timed("backward-compute"):
                                loss = y.pow(2).mean()
                                loss.backward()
                                total += loss.detach()
                            with timed("backward-send"):
                                dist.send(x.grad, dst=peer)
                        else:
                            grad = torch.empty_like(y)
                            with timed("backward-recv"):
                                dist.recv(grad, src=peer)
                            with timed("backward-compute"):
                                y.backward(grad)
                with timed("all-grads-sync"):
                    for p in layer.parameters():
                        dist.all_reduce(p.grad, group=dp_group)
                with timed("optimizer"):
                    opt.step()
                    opt.zero_grad()
            if rank == 2 and logged and iteration % (log_interval * 5) == 0:
                print(f" iteration {iteration:8d} | lm loss: {total.item():.6E}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
