"""Errors that cross the boundary between the Gate actor and the workers."""


class RunStopped(RuntimeError):
    """The run was told to stop (a deadline, Ctrl-C): grant nothing more. Documents not finished
    are left for a rerun, not recorded as failed."""
