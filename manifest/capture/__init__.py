"""``manifest capture``: a snapshot of machine and tree (``snapshot``).

The run's records (gathered by :mod:`manifest.launch.runner`, the launcher's host side)
and outputs made into the run's manifest (``run``).
"""
