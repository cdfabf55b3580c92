"""The runtime wing of `gpufleet serve`: what writes.

The HTTP side (the app, its routers, handlers, pages and sign-in) holds no state of its own:
it reads what this side wrote to the database. Here are the jobs the schedule runs and what
they write (:func:`service_jobs`: the sync, reconcile, prune, usage collect, the ACM
placement scores, the report's checks and where their outcome goes), the schedule itself
(:class:`Scheduler`) and its leadership (:func:`leadership`): exactly one process across
workers and replicas runs them; every process serves.
"""

from __future__ import annotations

from hub.service._leader import Leadership, leadership
from hub.service._scheduler import Jobs, Scheduler
from hub.service.runtime._jobs import CATCH_UP, checks_recorder, service_jobs

__all__ = ["CATCH_UP", "Jobs", "Leadership", "Scheduler", "checks_recorder", "leadership",
           "service_jobs"]
