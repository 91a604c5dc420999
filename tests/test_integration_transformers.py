"""HF Trainer ``TrainerCallback`` against the real library: a two-step train on CPU.

The model is a tiny torch module built here (no hub download); the Trainer
accepts any module whose forward returns a loss.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
import transformers


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x: Any, labels: Any) -> dict[str, Any]:
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}


class _SeesLogs(transformers.TrainerCallback):
    """A logger placed after ours, as report_to integrations are."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        self.logs.append(dict(logs or {}))


def _train(out: Path) -> tuple[Any, Any, _SeesLogs]:
    from manifest.integrations.transformers import ManifestTrainerCallback

    torch.manual_seed(0)
    rows = [{"x": torch.randn(4), "labels": torch.randn(2)} for _ in range(8)]
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=2, per_device_train_batch_size=4, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        remove_unused_columns=False, seed=0, data_seed=0)
    callback, seer = ManifestTrainerCallback(), _SeesLogs()
    trainer = transformers.Trainer(model=_Tiny(), args=args, train_dataset=rows,
                                   callbacks=[callback, seer])
    trainer.train()
    return callback, trainer, seer


def test_two_step_train_records_a_trail_and_attaches_the_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    callback, trainer, seer = _train(tmp_path / "out")
    points = callback.points
    assert [step for step, _ in points] == [1, 2]
    assert points[0][1] != points[1][1]
    run_id = callback.run_id
    assert run_id.startswith("blake3:")
    assert trainer.state.log_history[0]["manifest.run_id"] == run_id
    assert seer.logs and all(log["manifest.run_id"] == run_id for log in seer.logs)
    trail = json.loads(Path(callback.trail_file).read_text())
    assert trail["manifest.run_id"] == run_id
    assert [p["step"] for p in trail["trail"]] == [1, 2]
    again, _, _ = _train(tmp_path / "again")
    assert again.points == points
