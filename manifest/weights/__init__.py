"""Weight files as tensor tables: read safely (``tables``, one reader per format, the limits in
``bounds``), compared (``compare``)."""
