"""``manifest capture``: a snapshot of machine and tree (``snapshot``).

And a command run under the launcher, its outputs digested (``run``).
"""
