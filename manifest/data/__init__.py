"""Dataset digests, one module per step, each layer importing only those above it.

``listing`` (the format: what a root proves, path text, parse and diff) ←
``walk`` (the sorted entries below a top) ← ``reading`` (one checked read of
a file or a chunk) ← ``workers`` (what a forked worker runs, the wire) ←
``pool`` (the fork pool that hashes a listing) ← ``digest`` (one path's
root) ← ``datasets`` (specs, the data section, ``manifest hash``);
``cache`` (stat key → digest) is used by the reading and the pool.
"""
