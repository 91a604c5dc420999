"""Attach a manifest to a W&B run (pip install 'torch-manifest[wandb]').

    WANDB_MODE=offline python examples/integrations/wandb_log.py run.json identical
"""

from __future__ import annotations

import sys

import wandb

from manifest.integrations.wandb import log_manifest


def main() -> None:
    path = sys.argv[1]
    verdict = sys.argv[2] if len(sys.argv) > 2 else None
    run = wandb.init(project="manifest")
    print(log_manifest(path, verdict=verdict, run=run))
    run.finish()


if __name__ == "__main__":
    main()
