"""``manifest verify``: integrity, drift, data, a re-run in a scratch clone, a verdict.

The steps, in order, are listed in ``manifest.verify.pipeline``.
"""
