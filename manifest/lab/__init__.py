"""``manifest lab``: a training script's noise floor, bit-exactness, cost and op catalogue.

``runs`` (the pipeline), ``catalogue`` (which ops are nondeterministic, from
the installed torch), ``checklist`` (code, data, env, random state,
hardware, numerics) and ``report`` (the models behind ``--json``).
"""
