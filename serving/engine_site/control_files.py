"""Where a replica's control document and status live: one folder per replica, named to the engine
by an environment variable. Shared by the launcher, the controller's side and the plug-in (this
module imports nothing, so the engine process and the control plane can both read it)."""

CONTROL_DIR_ENV = "NIGHTSHIFT_CONTROL_DIR"
"""The replica's control folder, set by the launcher for every process of the replica."""
CONTROL_FILE = "control.json"
"""The controller's decision for this replica (`scheduler/control_document.py`)."""
STATUS_FILE = "status.json"
"""What the plug-in reports (`serving/engine_site/engine_status.py`)."""
