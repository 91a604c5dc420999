"""``manifest lab``: a training script's noise floor, bit-exactness, cost and op catalogue.

``runs`` (the pipeline), ``checklist`` (code, data, env, random state,
hardware, numerics) and ``report`` (the models behind ``--json``).
The op catalogue (which ops are nondeterministic, from the installed torch) is
:mod:`manifest.ops.catalogue`, shared with explain.
"""
