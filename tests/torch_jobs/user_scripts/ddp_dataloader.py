"""A plain DDP training script: a DataLoader with a worker process and a DistributedSampler, an
evaluation every 5 steps, the step timer around data, forward, backward and optimizer.

    torchrun --nnodes 2 --nproc-per-node 2 ... ddp_dataloader.py

SLOW_RANK / SLOW_S (environment): that rank sleeps SLOW_S more in its forward every step (a slow
GPU). STEPS: training steps (default 40), the job's
declared length; EXIT_INTERVAL: stop after that many steps (as Megatron's --exit-interval)."""

import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from faultlens.collectors.training.step_timer import StepTimer


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "40"))
    exit_interval = int(os.environ.get("EXIT_INTERVAL", str(steps)))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_S", "0.03"))

    torch.manual_seed(0)
    train = TensorDataset(torch.randn(8192, 64), torch.randint(0, 10, (8192,)))
    val = TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=32, sampler=sampler, num_workers=1)
    val_loader = DataLoader(val, batch_size=64, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    timer = StepTimer.from_env(total_steps=steps)

    def epochs():  # as many passes over the data as the steps need, reshuffled each epoch
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    batches = epochs()
    with timer:
        for step in range(min(steps, exit_interval)):
            with timer.step(step):
                with timer.section("data"):
                    x, y = next(batches)
                with timer.section("forward"):
                    time.sleep(0.01)  # the device's share of the work
                    if rank == slow_rank:
                        time.sleep(slow_s)
                    loss = F.cross_entropy(model(x), y)
                with timer.section("backward"):
                    loss.backward()
                with timer.section("optimizer"):
                    opt.step()
                    opt.zero_grad()
            if (step + 1) % 5 == 0:
                with timer.step(step, phase="eval"), torch.no_grad():
                    model.eval()
                    correct = torch.zeros(2)
                    for vx, vy in val_loader:
                        correct += torch.tensor([(model(vx).argmax(1) == vy).sum(), len(vy)])
                    dist.all_reduce(correct)
                    model.train()
                if rank == 0:
                    print(
                        f"step {step + 1} loss {loss.item():.3f} "
                        f"val acc {correct[0] / correct[1]:.3f}",
                        flush=True,
                    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
