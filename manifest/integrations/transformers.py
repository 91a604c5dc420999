"""Hugging Face Trainer: a ``TrainerCallback`` that records the parameter trail per step.

``Trainer(..., callbacks=[ManifestTrainerCallback()])``: at train begin it puts
the run's id (under the launcher ``manifest.launch_id``, its launch identity, the same in
the capture and every re-run; run bare, a sealed snapshot's ``manifest.run_id`` with
``manifest.digest``) into the trainer state's log history (saved with every
checkpoint's ``trainer_state.json``) and into every later ``logs`` dict, which
the report_to integrations after it (W&B, MLflow, TensorBoard …) receive;
after each optimizer step it fingerprints the model's parameters; at train
end it writes ``manifest-trail.json`` into ``args.output_dir``. Under the launcher it
also leaves locators of the active MLflow and W&B runs (report_to's callbacks come before
a user's, so they have started them) and of ``output_dir``, for ``capture`` to tag with
the real ``manifest.run_id`` once the run is sealed (``manifest.capture.trackers``).
"""

from __future__ import annotations

from typing import Any

from manifest.integrations._steps import CallbackState


class _Recorder(CallbackState):
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        tags = self.recorder.start(model)
        if tags and state.is_world_process_zero:
            state.log_history.append({**tags, "step": state.global_step})
            from manifest.integrations._locators import transformers_locators

            self.leave_locators(transformers_locators(args))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is not None:
            logs.update(self.recorder.tags)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.recorder.stop()
        if state.is_world_process_zero:  # a tracker run started after train begin
            from manifest.integrations._locators import transformers_locators

            self.leave_locators(transformers_locators(args))
        if state.is_world_process_zero and args.output_dir:
            self.trail_file = str(self.recorder.write(args.output_dir))


_CLASS: type | None = None


def _build() -> type:
    global _CLASS
    if _CLASS is None:
        from transformers import TrainerCallback

        _CLASS = type("ManifestTrainerCallback", (_Recorder, TrainerCallback),
                      {"__doc__": __doc__, "__module__": __name__})
    return _CLASS


def ManifestTrainerCallback(every: int = 1, *, snapshot: bool = True) -> Any:
    """A ``transformers.TrainerCallback`` (see the module docstring)."""
    return _build()(every, snapshot=snapshot)
