"""Structural diff of two manifests (``engine``: ``walk``, ``refine``, ``result``), labelled by
the impact table (``rules``) and worded by ``reasons``."""
