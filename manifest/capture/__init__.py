"""``manifest capture``: a snapshot of machine and tree (``snapshot``).

And a command run under the launcher (``launcher``), its records and outputs
made into the run's manifest (``run``).
"""
