"""Dataset digests: the walk and its listing (``tree``), the pool (``pool``), the cache (``cache``).

The format of a root, and what it proves, is written down in ``manifest.data.tree``.
"""
