"""Prefect flows, deployments and the `nightshift` command line."""

import os

# Without PREFECT_API_URL a flow run starts Prefect's ephemeral API server, which must answer within
# 20 s by default. On a 2-core host already running a replica and chat load it took longer, and
# `make demo` failed before its first document; a deployment's own server is not affected. Set
# here, before any flow module imports Prefect, and only where the caller has not chosen a value.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

# That ephemeral server's telemetry heartbeat writes to the server's SQLite file while the flow run
# does, and on a busy host its "database is locked" traceback landed in the middle of `make demo`'s
# output; the server is a temporary one for this process, so it sends none unless asked to.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
