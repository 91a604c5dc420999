"""A Lightning fit with the manifest callback (pip install 'torch-manifest[lightning]').

    manifest capture -- python examples/integrations/lightning_train.py > run.json

The callback logs the snapshot's run_id to the logger and a parameter
fingerprint per optimizer step; under `manifest capture` the launcher seeds
the script, so it needs no seed of its own, the callback logs the launch id
(`manifest.launch_id`), and the capture writes the run_id into the log directory
(`manifest-run.json`) once the run is sealed.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

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


def main() -> None:
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    callback = ManifestCallback(every=1)
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", callbacks=[callback],
                         logger=pl.loggers.CSVLogger("out", name="lightning"),
                         enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    # Under `manifest capture` the run_id exists only once the run is sealed: the
    # callback logs the launch id, and capture then tags the loggers with the run_id.
    print(f"run_id {callback.run_id or '(after capture seals)'}, launch id "
          f"{callback.launch_id}; trail in {callback.trail_file}")


if __name__ == "__main__":
    main()
