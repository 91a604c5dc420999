"""A tiny classifier on the bundled 8×8 images: the gate example's training.

It does not seed itself: under ``manifest capture`` / ``manifest gate`` the
launcher seeds every generator and sets the deterministic flags before this
code runs. Everything that decides the weights is recorded: the code (git),
``data/`` (declared in pyproject.toml), the seed, the flags, the thread
count (pinned to 1) and the environment.

    manifest gate                      # determinism, baseline, hygiene
    manifest gate --update-baseline    # accept a change to the weights
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn


def load(data: Path) -> tuple[torch.Tensor, torch.Tensor]:
    raw = bytearray((data / "images.bin").read_bytes())
    images = torch.frombuffer(raw, dtype=torch.uint8).float().div(255).view(-1, 64)
    labels = torch.frombuffer(bytearray((data / "labels.bin").read_bytes()), dtype=torch.uint8)
    return images, labels.long()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--data", default="data")
    parser.add_argument("--out", default="out")
    args = parser.parse_args()

    images, labels = load(Path(args.data))
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _epoch in range(args.epochs):
        # Every sample is seen every epoch, so every data byte reaches the weights.
        for batch in torch.randperm(images.shape[0]).split(32):
            loss = F.cross_entropy(model(images[batch]), labels[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"))
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
