"""Structural diff of two manifests (``engine``), labelled by the impact table (``rules``)."""
