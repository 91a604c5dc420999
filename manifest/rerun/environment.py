"""What the re-run's processes get besides the plan's settings: their argv and environment.

* **argv**: the recorded argv, with withheld values (``<redacted:N>``) filled
  from ``MANIFEST_SECRET_N`` in the verb's own environment, never from the
  manifest; a missing one is refused with one sentence before anything runs.
* **environment**: today's, with the recorded numerics variables put back
  (``OMP_*``, ``CUBLAS_WORKSPACE_CONFIG`` …), without the ``MANIFEST_SECRET_N``
  values (they went into the argv only), and with the recorded code
  variables (``PYTHONPATH`` …) replayed where ``{repo}`` stands for the tree
  the command sees.
"""

from __future__ import annotations

import os
from pathlib import Path

from manifest.models import Manifest


def argv_to_run(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The recorded argv with withheld values filled from ``MANIFEST_SECRET_N``."""
    from manifest.errors import UsageError
    from manifest.redact import MissingSecretsError, restore_argv

    try:
        return restore_argv(list(argv), os.environ)
    except MissingSecretsError as exc:
        raise UsageError(f"cannot re-run: {exc}.",
                         hint="Values are never read from the manifest.") from exc


def numerics_env(recorded: Manifest) -> dict[str, str]:
    """Today's environment with the recorded numerics variables put back
    (and without the ``MANIFEST_SECRET_N`` values, which went into the argv)."""
    from manifest.probes.env import NUMERICS_VARIABLES
    from manifest.redact import SECRET_ENV_PREFIX

    env = {k: v for k, v in os.environ.items()
           if k not in NUMERICS_VARIABLES and not k.startswith(SECRET_ENV_PREFIX)}
    env.update(recorded.env.variables)
    return env


def rerun_env(recorded: Manifest, tree_seen: Path) -> tuple[dict[str, str], list[str]]:
    """(the re-run's base environment, recorded code-path entries missing here).

    ``tree_seen`` is where the command sees the tree: the repository's own path
    when confined (the clone is mounted there), else the scratch clone.
    """
    from manifest.rerun.inputs import code_env

    env = numerics_env(recorded)
    replay, absent = code_env(recorded, tree_seen)
    if replay is not None:
        from manifest.capture.observed import CODE_ENV_VARS

        env = {k: v for k, v in env.items() if k not in CODE_ENV_VARS}
        env.update(replay)
    return env, absent
