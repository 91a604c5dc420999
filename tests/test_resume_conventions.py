"""Known resume conventions need no template: Lightning's ``Trainer.fit(ckpt_path=…)``
and the Hugging Face ``Trainer.train(resume_from_checkpoint=…)``.

A real Lightning fit (Adam, StepLR, dropout, a shuffled DataLoader) that
checkpoints at each epoch's end through ``ModelCheckpoint`` and keeps the
torch generator in the checkpoint (``on_save_checkpoint``). With no
``[tool.manifest] resume``, the launcher hands the checkpoint to ``fit`` as
``ckpt_path``; Lightning's own checkpoints are recorded at capture through
its ``_atomic_save``. The planted fault (``--forget-rng``) leaves the generator
out of the restore.

A real Hugging Face Trainer run on a tiny model built in the test (no hub):
``checkpoint-N`` directories every 4 steps, each file recorded at its step; a
replay gets the whole directory placed and the Trainer gets the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs import make_repo, manifest_cli

pytest.importorskip("lightning")

FIT = """# A Lightning fit that checkpoints at every epoch's end and carries its RNG state.
import sys
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)]

    def on_save_checkpoint(self, checkpoint):
        checkpoint["torch_rng"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint):
        if "--forget-rng" not in sys.argv:  # the planted fault: dropout masks then differ
            torch.set_rng_state(checkpoint["torch_rng"])


data = TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
trainer = pl.Trainer(
    max_epochs=4, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
    enable_model_summary=False, default_root_dir=".",
    callbacks=[ModelCheckpoint(dirpath="ck", filename="{step}", every_n_epochs=1, save_top_k=-1,
                               save_on_train_epoch_end=True)])
trainer.fit(Tiny(), DataLoader(data, batch_size=16, shuffle=True))
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("lightning") / "repo",
                     {"fit.py": FIT, ".gitignore": "ck/\n*.json\n"}, example=False)
    cap = manifest_cli("capture", "--seed", "0", "--artifact", "ck/*.ckpt", "--", "python",
                       "fit.py", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    return repo


@pytest.mark.slow
def test_lightning_checkpoints_are_recorded_and_segments_resume_through_ckpt_path(
        repo: Path) -> None:
    doc = json.loads((repo / "run.json").read_text())
    assert [(c["step"], c["path"], c["artifact"]["format"])
            for c in doc["outputs"]["checkpoints"]] == [
        (4, "ck/step=4.ckpt", "torch"), (8, "ck/step=8.ckpt", "torch"),
        (12, "ck/step=12.ckpt", "torch"), (16, "ck/step=16.ckpt", "torch")]
    out = manifest_cli("verify", "-q", "--at", "6", "--format", "json", "run.json", cwd=repo)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    [seg] = json.loads(out.stdout)["segments"]
    assert (seg["start"], seg["end"], seg["verdict"], seg["steps_compared"]) == (4, 8,
                                                                               "identical", 4)
    assert seg["end_checkpoints"] == {"ck/step=8.ckpt": True}


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "identical"), [((), True), (("--forget-rng",), False)])
def test_lightning_resume_audit(repo: Path, extra: tuple[str, ...], identical: bool) -> None:
    out = manifest_cli("lab", "-q", "--resume-at", "8", "--format", "json", "--", "python",
                       "fit.py", *extra, cwd=repo)
    assert out.returncode == (0 if identical else 1), out.stderr.decode()
    audit = json.loads(out.stdout)
    assert audit["identical"] is identical and audit["steps_compared"] == 8
    if not identical:
        assert audit["first_divergent_step"] == 9
        assert audit["forgotten"] == ["torch's CPU RNG state"]


HF = """# A Hugging Face Trainer on a tiny model built here (no hub), checkpoints every 4 steps.
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Pairs(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, 2, generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop = torch.nn.Linear(8, 16), torch.nn.Dropout(0.1)
        self.b = torch.nn.Linear(16, 2)

    def forward(self, x, labels=None):
        out = self.b(self.drop(self.a(x)))
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


args = TrainingArguments(output_dir="out", per_device_train_batch_size=16, max_steps=16,
                         save_strategy="steps", save_steps=4, logging_steps=100, report_to=[],
                         use_cpu=True, seed=0, disable_tqdm=True)
Trainer(model=Net(), args=args, train_dataset=Pairs()).train()
"""


@pytest.mark.slow
def test_hf_trainer_checkpoints_segments_and_resume_audit(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    repo = make_repo(tmp_path / "repo", {"hf.py": HF, ".gitignore": "out/\n*.json\n"},
                     example=False)
    cap = manifest_cli("capture", "--seed", "0", "--artifact",
                       "out/checkpoint-16/model.safetensors", "--", "python", "hf.py", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    saved = {(c["step"], c["path"]) for c in json.loads(cap.stdout)["outputs"]["checkpoints"]}
    assert {(4, "out/checkpoint-4/model.safetensors"), (4, "out/checkpoint-4/optimizer.pt"),
            (4, "out/checkpoint-4/rng_state.pth"), (16, "out/checkpoint-16/scheduler.pt")} <= saved
    out = manifest_cli("verify", "-q", "--at", "6", "--format", "json", "run.json", cwd=repo)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    [seg] = json.loads(out.stdout)["segments"]
    assert seg["checkpoint"] == "out/checkpoint-4/model.safetensors"
    assert seg["verdict"] == "identical" and seg["steps_compared"] == 4
    assert seg["end_checkpoints"]["out/checkpoint-8/optimizer.pt"] is True
    audit = manifest_cli("lab", "-q", "--resume-at", "8", "--format", "json", "--", "python",
                         "hf.py", cwd=repo)
    assert audit.returncode == 0, audit.stdout.decode() + audit.stderr.decode()
    assert json.loads(audit.stdout)["steps_compared"] == 8
