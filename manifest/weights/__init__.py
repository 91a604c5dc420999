"""Weight files as tensor tables: read safely (``tables``), compared (``compare``)."""
