"""Defaults of `nightshift bench` on a CPU replica, shared by the real and the simulated bench.

A GPU profile under `--sim` has its own (bench/sim_scenarios.py `GpuDefaults`)."""

RATE = 1.5
"""Chat requests per second (Poisson)."""
DOCS = 200
"""Documents in the corpus: more than any scenario finishes."""
WINDOW_S = 15.0
"""SLO window, seconds."""
