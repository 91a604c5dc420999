"""``manifest explain``: where two runs part — step, op, module path, file:line.

``stream`` reads the op streams the launcher's recorder writes, ``align``
lines two of them up and finds the first op that computes differently,
``findings`` turns that into a report entry (with the lab's table of ops
torch documents as nondeterministic), and ``pipeline`` runs the recorded
command to get the streams.
"""
