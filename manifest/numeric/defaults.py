"""The noise model's two settings, importable without pydantic or torch.

``manifest verify --help`` names the default number of envelope runs, and ``--help``
imports nothing heavy (``tests/test_cli_startup.py``), so the numbers live here and
:mod:`manifest.numeric.calibration` (which needs the models) re-exports them.
"""

from __future__ import annotations

ALPHA = 0.01
"""The false-``differs`` rate the bound is fitted for: a rounding-only re-run falls
outside it about 1 time in 1/ALPHA."""

DEFAULT_RUNS = 6
"""One-ULP runs an envelope measures by default (capture, lab, verify --envelope): the
t margin (99.5%, half of ALPHA per test) falls from 6.5 sd at 4 runs to 4.4 at 6 and
3.7 at 8; at 4, one replayed envelope in 40 let a planted change through, at 6 none
(``manifest.numeric.calibration``'s docstring, benchmarks/calibration.py)."""
