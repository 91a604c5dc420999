"""Real CPU training, in this process, that records the launcher's numeric trail.

The calibration set of issues 28 and 36: three tiny models (the bundled example's CNN, a
third-party-style Transformer encoder with Adam, a GRU language model with Adam),
trained for a few dozen steps with the launcher's own trail functions
(``_manifest_trail.numeric_point`` after each optimizer step, ``perturb_one_ulp``
before the first), so a test can make a dozen runs in seconds without a process each.
``plant`` names one real change:

* ``lr`` (×1.01 from step 1), ``lr1e-3`` (×1.001), ``loss`` (×1.001), ``dropout`` (p + 0.05),
  ``shard`` (another slice of the data), ``swap@k`` (step k trains on another
  batch), ``bias@k`` (1e-3 added to one weight before step k's forward),
  ``wd`` (weight decay 1e-4), ``clip`` (gradient norm clipped at 1.0),
  ``skip@k`` (step k's update left out), ``labels@k`` (one label changed at step k).

Each change is a code or data change in real life (so verify would never call it
rounding); here it is planted to prove the numeric comparison alone catches it.
"""

from __future__ import annotations

from typing import Any

KINDS = ("cnn", "transformer", "gru")
"""``cnn``: the bundled example's SmallCNN (BatchNorm, dropout, SGD with momentum);
``transformer``: one encoder layer (Adam); ``gru``: a one-layer GRU language model (Adam)."""
SEQUENCE = ("transformer", "gru")
LR = {"lr": 1.01, "lr1e-3": 1.001}
PLANTS = ("lr", "lr1e-3", "loss", "dropout", "shard", "wd", "clip")
AT_K = ("swap", "bias", "skip", "labels")


def _model(torch: Any, kind: str, dropout: float) -> Any:
    nn = torch.nn
    if kind == "transformer":
        class Tiny(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(32, 32)
                self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout,
                                                        batch_first=True)
                self.head = nn.Linear(32, 32)

            def forward(self, x: Any) -> Any:
                return self.head(self.layer(self.embed(x)))

        return Tiny()
    if kind == "gru":
        class Recurrent(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(32, 32)
                self.rnn = nn.GRU(32, 48, batch_first=True)
                self.drop = nn.Dropout(dropout)
                self.head = nn.Linear(48, 32)

            def forward(self, x: Any) -> Any:
                return self.head(self.drop(self.rnn(self.embed(x))[0]))

        return Recurrent()
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from train import SmallCNN  # type: ignore[import-not-found]

    model = SmallCNN()
    model.dropout.p = dropout
    return model


def train(kind: str = "transformer", *, steps: int = 30, threads: int = 2,
          plant: str | None = None, perturb: int | None = None,
          deterministic: bool = True, mkldnn: bool = True, device: str = "cpu",
          dropout: float = 0.1, precision: str = "fp32") -> list[dict[str, Any]]:
    """One run's numeric trail: ``[{"step", "loss", "groups"}]``.

    ``precision`` (``fp32``, ``tf32``, ``bf16``) is the device's own on CUDA (TF32 allowed
    in matmuls and cuDNN, or bf16 autocast around the forward and the loss, TF32 off) and
    the launcher's emulation of it on CPU (``_manifest_precision.emulating``)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from manifest.launch.boot import _manifest_trail as trail
    from manifest.launch.boot._manifest_precision import emulating

    if precision not in ("fp32", "tf32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}")
    on_cpu = torch.device(device).type == "cpu"
    if on_cpu:
        emulation: Any = (emulating(precision) if precision != "fp32"
                          else contextlib.nullcontext())
        with emulation:
            return _train(torch, F, trail, kind, steps, threads, plant, perturb,
                          deterministic, mkldnn, device, dropout, None)
    switches = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        return _train(torch, F, trail, kind, steps, threads, plant, perturb, deterministic,
                      mkldnn, device, dropout,
                      torch.bfloat16 if precision == "bf16" else None)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = switches


def _train(torch: Any, F: Any, trail: Any, kind: str, steps: int, threads: int,
           plant: str | None, perturb: int | None, deterministic: bool, mkldnn: bool,
           device: str, dropout: float, autocast: Any) -> list[dict[str, Any]]:
    import contextlib

    name, _, at = (plant or "").partition("@")
    k = int(at) if at else 0
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    onednn = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = mkldnn  # oneDNN or ATen
    try:
        torch.manual_seed(0)
        model = _model(torch, kind, dropout + (0.05 if name == "dropout" else 0.0))
        if kind in SEQUENCE:
            data = torch.randint(0, 32, (1024, 12))
            targets = (data + 1) % 32
            opt: Any = torch.optim.Adam(model.parameters(), lr=1e-3 * LR.get(name, 1.0),
                                        weight_decay=1e-4 if name == "wd" else 0.0)
        else:
            data = torch.randn(1024, 1, 16, 16)
            targets = (data.mean(dim=(1, 2, 3)) * 10).long().clamp(-4, 5) + 4
            opt = torch.optim.SGD(model.parameters(), lr=0.05 * LR.get(name, 1.0),
                                  momentum=0.9,
                                  weight_decay=1e-4 if name == "wd" else 0.0)
        model = model.to(device)
        data, targets = data.to(device), targets.to(device)
        gen = torch.Generator().manual_seed(1)
        start = 512 if name == "shard" else 0
        points: list[dict[str, Any]] = []
        for step in range(1, steps + 1):
            idx = torch.randint(start, start + 512, (32,), generator=gen)
            if name == "swap" and step == k:
                idx = torch.randint(start, start + 512, (32,), generator=torch.Generator()
                                    .manual_seed(99))
            idx = idx.to(device)
            y = targets[idx].clone()
            if name == "labels" and step == k:
                y.view(-1)[0] = (y.view(-1)[0] + 1) % 10
            if name == "bias" and step == k:
                with torch.no_grad():
                    next(model.parameters()).view(-1)[0] += 1e-3
            cast: Any = (torch.autocast(torch.device(device).type, dtype=autocast)
                         if autocast is not None else contextlib.nullcontext())
            with cast:
                out = model(data[idx])
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            if name == "loss":
                loss = loss * 1.001
            opt.zero_grad()
            loss.backward()
            if name == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if perturb is not None and step == 1:
                trail.perturb_one_ulp(list(model.parameters()), perturb)
            if not (name == "skip" and step == k):
                opt.step()
            point = trail.numeric_point(trail.optimizer_groups(opt), loss)
            assert point is not None
            points.append({"step": step, **point})
        return points
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(False)
        torch.backends.mkldnn.enabled = onednn
