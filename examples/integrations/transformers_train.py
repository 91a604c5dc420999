"""A Hugging Face Trainer run with the manifest callback.

    pip install 'torch-manifest[transformers]'

    manifest capture -- python examples/integrations/transformers_train.py > run.json
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from manifest.integrations.transformers import ManifestTrainerCallback


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x: Any, labels: Any) -> dict[str, Any]:
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}


def main() -> None:
    rows = [{"x": torch.randn(4), "labels": torch.randn(2)} for _ in range(64)]
    args = transformers.TrainingArguments(
        output_dir="out/hf", max_steps=10, per_device_train_batch_size=8, logging_steps=5,
        report_to=[], use_cpu=True, save_strategy="no", remove_unused_columns=False)
    callback = ManifestTrainerCallback(every=1)
    transformers.Trainer(model=Tiny(), args=args, train_dataset=rows,
                         callbacks=[callback]).train()
    # Under `manifest capture` the run_id exists only once the run is sealed: the
    # callback logs the launch id, and capture then tags the loggers with the run_id.
    print(f"run_id {callback.run_id or '(after capture seals)'}, launch id "
          f"{callback.launch_id}; trail in {callback.trail_file}")


if __name__ == "__main__":
    main()
