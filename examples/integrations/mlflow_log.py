"""Attach a manifest to an MLflow run (pip install 'torch-manifest[mlflow]').

    manifest capture --artifact 'out/*.safetensors' -- python examples/train.py > run.json
    manifest verify run.json && python examples/integrations/mlflow_log.py run.json identical
"""

from __future__ import annotations

import sys

import mlflow

from manifest.integrations.mlflow import log_manifest


def main() -> None:
    path = sys.argv[1]
    verdict = sys.argv[2] if len(sys.argv) > 2 else None
    with mlflow.start_run(run_name="training"):
        tags = log_manifest(path, verdict=verdict)
    print(tags)


if __name__ == "__main__":
    main()
