"""Lightning ``Callback`` against the real library: a two-step fit on CPU, a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as pl
import torch


def _fit(root: Path, every: int = 1) -> Any:
    from manifest.integrations.lightning import ManifestCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callback = ManifestCallback(every=every)
    trainer = pl.Trainer(
        max_steps=2, accelerator="cpu", devices=1, callbacks=[callback],
        logger=pl.loggers.CSVLogger(str(root), name="logs"), enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(root))
    trainer.fit(Tiny(), loader)
    return callback, trainer


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on num_workers and such
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # Lightning 2.6 on torch 2.13
def test_two_step_fit_records_a_trail_and_logs_the_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    callback, trainer = _fit(tmp_path)
    points = callback.points
    assert [step for step, _ in points] == [1, 2]
    assert points[0][1] != points[1][1]  # the weights moved
    assert callback.run_id.startswith("blake3:")
    hparams = Path(trainer.log_dir, "hparams.yaml").read_text()
    assert callback.run_id in hparams
    assert "manifest.digest" in hparams
    trail = Path(callback.trail_file).read_text()
    assert points[1][1] in trail
    # The same seed on the same machine gives the same trail: it can locate a divergence.
    again, _ = _fit(tmp_path / "again")
    assert again.points == points
