"""Prefect flows, deployments and the `nightshift` command line."""
