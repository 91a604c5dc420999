"""A small CNN trained on synthetic data: the bundled example for capture/verify.

Runs in a few seconds on CPU. It does not seed itself: under ``manifest
capture`` the launcher seeds every generator before this code runs, and
``manifest verify`` re-runs it under the same seed. Works under torchrun
(gloo on CPU): each rank trains on its shard and gradients are averaged.

    manifest capture --seed 0 --artifact 'out/*.safetensors' -- python examples/train.py

A long run saves a checkpoint every N steps (``--save-every N``: model,
optimizer, the torch generator and the step, in ``out/ckpt/step-<k>.pt``) and
resumes from one (``--resume PATH``), bit for bit: ``[tool.manifest] resume =
"--resume {checkpoint}"`` lets ``manifest verify --segments`` replay stretches.
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
    parser.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps")
    parser.add_argument("--resume", default=None, help="a checkpoint to continue from")
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
    start = 0
    if args.resume:
        # Everything the next step depends on: weights, momentum, the generator that draws
        # the batches and dropout masks, the step. The data above was drawn before, from
        # the seed, exactly as in the uninterrupted run.
        state = torch.load(args.resume, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start = int(state["step"])
    if args.trail:
        manifest.trail(model, every=args.trail)
    for step in range(start, args.steps):
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
        if args.save_every and (step + 1) % args.save_every == 0 and rank == 0:
            ckpt = Path(args.out) / "ckpt"
            ckpt.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "rng": torch.get_rng_state(), "step": step + 1},
                       ckpt / f"step-{step + 1}.pt")
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
