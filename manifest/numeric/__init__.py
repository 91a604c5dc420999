"""Numbers, not bits: comparing two runs by how far apart they are, step by step.

``envelope`` turns numeric trails (recorded by the launcher, ``_manifest_trail``) into
a run's own noise envelope and judges a re-run against it: ``equivalent`` (the same run
up to rounding) or ``differs`` (the first step outside, how far, which parameter group).
"""
