"""Where a training run logs: the tracker locators the callbacks leave for ``capture``.

Under the launcher, the run_id is known only after the run, so the callbacks log the
launch id and leave, in this process's launcher record, where each tracker run lives
(``manifest.capture.trackers`` tags them once the manifest is sealed): MLflow (tracking
URI, run id), W&B (entity/project/run id, offline or not, its directory) and log
directories (TensorBoard/CSV loggers' ``log_dir``, HF ``output_dir``), as absolute paths
and URIs, since the capture reads them from another working directory.

They go where the trail points go: into the record the launcher writes at exit (the
``_manifest_state`` module the launcher loaded under its top-level name); run bare there is
no such record and nothing is left. A logger this cannot read is left out, never an error
in the user's training loop.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from manifest.capture.tracker_names import MAX_LOCATORS, TRACKERS_KEY
from manifest.launch.boot._manifest_wire import RECORDS_VAR


def leave(locators: list[dict[str, Any]]) -> bool:
    """Add ``locators`` to this process's launcher record; False when not under the launcher."""
    state = sys.modules.get("_manifest_state")
    record = getattr(state, "state", {}).get("record") if state is not None else None
    if not isinstance(record, dict) or not os.environ.get(RECORDS_VAR):
        return False
    kept = record.setdefault(TRACKERS_KEY, [])
    for loc in locators:
        if loc not in kept and len(kept) < MAX_LOCATORS:
            kept.append(loc)
    return True


def _absolute_uri(uri: str) -> str:
    """A local tracking URI made absolute (``file:./mlruns``, ``./mlruns``); others as given."""
    from pathlib import Path

    if "://" in uri:
        return uri
    path = uri[len("file:"):] if uri.startswith("file:") else uri
    if ":" in path:  # another scheme without // (databricks:profile, sqlite:…)
        return uri
    return Path(os.path.abspath(path)).as_uri()


def _named(obj: Any, name: str) -> bool:
    return any(c.__name__ == name for c in type(obj).__mro__)


def mlflow_locator(tracking_uri: str, run_id: str) -> dict[str, Any]:
    return {"kind": "mlflow", "tracking_uri": _absolute_uri(str(tracking_uri)),
            "run_id": str(run_id)}


def wandb_locator(run: Any) -> dict[str, Any]:
    """A W&B ``Run``'s locator (``wandb.run``, a ``WandbLogger``'s ``experiment``)."""
    return {"kind": "wandb", "entity": run.entity or None, "project": run.project,
            "run_id": run.id, "offline": bool(run.offline),
            "dir": os.path.abspath(run.dir) if run.dir else None}


def log_dir_locator(path: str) -> dict[str, Any]:
    """A log directory, absolute; a URL (TensorBoard's ``s3://…``) as given, so capture
    can say it is no local directory rather than write into ``./s3:/…``."""
    path = str(path)
    return {"kind": "log_dir", "path": path if "://" in path else os.path.abspath(path)}


def lightning_locators(trainer: Any) -> list[dict[str, Any]]:
    """One locator per logger of a Lightning ``Trainer`` that can be named."""
    found = []
    for logger in trainer.loggers:
        # A logger we cannot read is no locator, never a failed fit.
        with contextlib.suppress(Exception):
            if _named(logger, "MLFlowLogger"):
                found.append(mlflow_locator(logger.experiment.tracking_uri, logger.run_id))
            elif _named(logger, "WandbLogger"):
                found.append(wandb_locator(logger.experiment))
            elif getattr(logger, "log_dir", None):
                found.append(log_dir_locator(logger.log_dir))
    return found


def transformers_locators(args: Any) -> list[dict[str, Any]]:
    """The HF Trainer's trackers: the active MLflow and W&B runs (report_to started them
    before this callback's hooks run), and ``output_dir``."""
    found = []
    mlflow = sys.modules.get("mlflow")
    with contextlib.suppress(Exception):
        active = mlflow.active_run() if mlflow is not None else None
        if mlflow is not None and active is not None:
            found.append(mlflow_locator(mlflow.get_tracking_uri(), active.info.run_id))
    wandb = sys.modules.get("wandb")
    with contextlib.suppress(Exception):
        if wandb is not None and wandb.run is not None:
            found.append(wandb_locator(wandb.run))
    if getattr(args, "output_dir", None):
        found.append(log_dir_locator(args.output_dir))
    return found
