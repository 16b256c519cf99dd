"""Production-shaped chat traffic and side-by-side scenarios."""
