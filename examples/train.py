"""A small CNN trained on synthetic data: the bundled example for capture/verify.

Runs in a few seconds on CPU. It does not seed itself: under ``manifest
capture`` the launcher seeds every generator before this code runs, and
``manifest verify`` re-runs it under the same seed. Works under torchrun
(gloo on CPU): each rank trains on its shard and gradients are averaged.

    manifest capture --seed 0 --artifact 'out/*.safetensors' -- python examples/train.py
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

import manifest


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.dropout(x.flatten(1)))  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default="out")
    parser.add_argument("--trail", type=int, default=0, help="record a step trail every N steps")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    rank, world = 0, 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

    # Synthetic data drawn from the (launcher-seeded) generator.
    images = torch.randn(512, 1, 16, 16)
    labels = (images.mean(dim=(1, 2, 3)) * 10).long().clamp(-4, 5) + 4
    model = SmallCNN()
    if distributed:
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.trail:
        manifest.trail(model, every=args.trail)
    for _ in range(args.steps):
        idx = torch.randint(0, images.shape[0], (32,))
        idx = idx[rank::world]
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        if distributed:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        manifest.log(loss=loss.item())  # read by `manifest lab` (loss gap); no-op unlaunched
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(out / "model.safetensors"))
        print(f"final loss {loss.item():.6f}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
