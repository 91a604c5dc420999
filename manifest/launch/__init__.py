"""The launcher: what runs inside the user's processes.

``boot/`` is the directory put first on the child's ``PYTHONPATH`` (and on
``sys.path`` by the ``torch_manifest.pth`` start-up hook wherever
``MANIFEST_LAUNCH`` is set, so a replaced ``PYTHONPATH`` does not lose it): its
``sitecustomize`` loads ``_manifest_launch``, which seeds, enforces the
recipe and writes a per-process record at exit. ``recipe`` is the same
recipe as a Python API (``manifest.seed_everything``, ``deterministic`` …).

The host's side is here too: ``runner`` starts a command under the launcher and
gathers its records (capture, the re-run engine, the node records and the envelope
runs all call it), and ``outside`` finds the processes that escaped it. They sit
below every verb, so nothing that runs a command imports a verb back.
"""
