"""``manifest explain``: where two runs part — step, op, module path, file:line.

``pipeline`` runs the recorded command twice with the op recorder on and reports
where the streams part; reading and aligning the streams is :mod:`manifest.ops`,
which verify and lab share.
"""
