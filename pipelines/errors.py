"""Errors that cross the boundary between the Gate actor and the workers."""


class RunStopped(RuntimeError):
    """The run was told to stop (a deadline, Ctrl-C): grant nothing more. Documents not finished
    are left for a rerun, not recorded as failed."""


class GateLost(RuntimeError):
    """The run's Gate actor died mid-attempt (its process killed, its node lost). The attempt ends:
    what finished is kept, the requests the Gate had granted are recorded as killed, and the
    same run id resumes the rest (the flow retries the pipeline once by itself)."""


class LeaseLapsed(RuntimeError):
    """A worker asked for a seat and fell silent past its lease (`pipelines/seat_leases.py`): it
    is taken for dead, and its calls still waiting at the Gate get no seat."""


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the run's driver (a supervisor's stop). A KeyboardInterrupt, so that every
    path that stops a run cleanly on Ctrl-C does so on SIGTERM too (`pipelines/ray_session.py`)."""
