"""The launcher: what runs inside the user's processes.

``boot/`` is the directory put first on the child's ``PYTHONPATH``: its
``sitecustomize`` loads ``_manifest_launch``, which seeds, enforces the
recipe and writes a per-process record at exit. ``recipe`` is the same
recipe as a Python API (``manifest.seed_everything``, ``deterministic`` …).
"""
