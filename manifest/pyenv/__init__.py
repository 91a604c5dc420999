"""The run's Python environment: a standard lock of it, or rebuilt with uv and proven.

The entry point is :func:`manifest.pyenv.rebuild.build_environment` (a verb that re-runs
in the run's environment calls it and shows ``proof.line()`` before any training
starts); :func:`manifest.pyenv.lock.build_lock` writes the PEP 751 lock. One module per
job: ``sources`` (the one check of recorded values, and which sources trust allows),
``archives`` (which source serves each wheel), ``lock``, ``rebuild``, ``prove``, ``cache``.
"""
