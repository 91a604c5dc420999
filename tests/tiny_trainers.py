"""The tiny Lightning and Hugging Face training scripts the integration tests run.

One module so the tests that need "a LightningModule of one Linear layer" or "a Trainer
of one Linear layer" share it; each test says only what differs (steps, logger, saving)."""

from __future__ import annotations


def lightning_script(*, rows: int, steps: int, logger: str = "", imports: str = "",
                     after: str = "") -> str:
    """A Lightning fit of one Linear layer with ``ManifestCallback``; ``logger`` is a
    ``Trainer`` keyword argument (``"logger=MLFlowLogger(...), "``) or nothing."""
    return f"""
import torch
import lightning.pytorch as pl
from manifest.integrations.lightning import ManifestCallback
{imports}

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn({rows}, 4), torch.randn({rows}, 2))
loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=0)
trainer = pl.Trainer(max_steps={steps}, accelerator="cpu", devices=1, enable_progress_bar=False,
                     enable_model_summary=False, {logger}callbacks=[ManifestCallback()])
trainer.fit(Tiny(), loader)
{after}"""


def hf_script(*, steps: int, saving: str) -> str:
    """A Hugging Face ``Trainer`` run of one Linear layer with ``ManifestTrainerCallback``
    into ``hf_out``; ``saving`` is the ``TrainingArguments`` keywords that say how it saves."""
    return f"""
import torch
import transformers
from manifest.integrations.transformers import ManifestTrainerCallback


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x, labels):
        return {{"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}}


rows = [{{"x": torch.randn(4), "labels": torch.randn(2)}} for _ in range(8)]
args = transformers.TrainingArguments(
    output_dir="hf_out", max_steps={steps}, per_device_train_batch_size=4, report_to=[],
    use_cpu=True, {saving}, disable_tqdm=True, remove_unused_columns=False, seed=0,
    data_seed=0)
transformers.Trainer(model=Tiny(), args=args, train_dataset=rows,
                     callbacks=[ManifestTrainerCallback()]).train()
"""
