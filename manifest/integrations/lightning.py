"""Lightning: a ``Callback`` that records the parameter trail per optimizer step.

``Trainer(callbacks=[ManifestCallback()])``: at fit start it logs the run's id as a
hyperparameter of every logger the trainer has: under the launcher ``manifest.launch_id``
(the run's launch identity, the same in the capture and every re-run), and it leaves a
locator of each logger (MLFlowLogger, WandbLogger, a logger's ``log_dir``) for
``capture`` to tag with the real ``manifest.run_id`` once the run is sealed; run bare,
the ``manifest.run_id`` and ``manifest.digest`` of a snapshot it seals (see
``manifest.integrations._steps``); after
each optimizer step it fingerprints the LightningModule's parameters; at fit
end it writes ``manifest-trail.json`` into the trainer's log directory. A
Lightning script run under ``manifest capture`` no longer depends on seeding
itself: the launcher seeds it, and the trail shows the first step where two
runs part.
"""

from __future__ import annotations

from typing import Any

from manifest.integrations._steps import CallbackState


def _callback_base() -> type:
    import importlib

    try:
        module = importlib.import_module("lightning.pytorch.callbacks")
    except ImportError:  # the standalone pytorch_lightning distribution
        module = importlib.import_module("pytorch_lightning.callbacks")
    base: type = module.Callback
    return base


class _Recorder(CallbackState):
    """Methods of :class:`ManifestCallback`, mixed into Lightning's Callback at first use."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        tags = self.recorder.start(pl_module)
        if trainer.is_global_zero and tags:
            for logger in trainer.loggers:
                logger.log_hyperparams(tags)
            from manifest.integrations._locators import lightning_locators

            self.leave_locators(lightning_locators(trainer))

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.recorder.stop()
        if trainer.is_global_zero and trainer.log_dir:
            self.trail_file = str(self.recorder.write(trainer.log_dir))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.recorder.stop()


_CLASS: type | None = None


def _build() -> type:
    global _CLASS
    if _CLASS is None:
        _CLASS = type("ManifestCallback", (_Recorder, _callback_base()),
                      {"__doc__": __doc__, "__module__": __name__})
    return _CLASS


def ManifestCallback(every: int = 1, *, snapshot: bool = True) -> Any:
    """A Lightning ``Callback`` (see the module docstring); Lightning is imported here."""
    return _build()(every, snapshot=snapshot)
