"""Queues, in one home: an organisation's guaranteed shares per GPU type, borrowing,
priority classes and bounded preemption, from the configuration to the rows of Sia's
ILP, what a round did to them, and how a simulated run measures them.

    model.py     the configuration: `QueueSet`, `Queue`, `PriorityClass`, and which
                 queue and class a job is scheduled in (`scheduled_in`)
    rows.py      how queues enter the ILP: priority weights, minimum-runtime holds,
                 guarantee, borrowing and restart-budget rows (`SideRows`)
    outcome.py   what a round did to the queues: binding guarantees, reclaims, and
                 the queue rule a waiting job is held by (the controller's reasons)
    files.py     the simulator's queues file and its rule for putting a trace's jobs
                 into queues
    measures.py  per-queue metrics of a simulated run: guarantee violation,
                 shortfall, reclaim

Everything here is pure and sits low in the policy: it reads jobs, candidate tables,
round results and the simulator's records through small Protocols, so it imports
neither the rest of the policy's rounds nor any shell (the controller, the simulator).
The package itself offers the model, as `sia_grpc.policy.queues` always has; the rest
is imported from its module.
"""

from sia_grpc.policy.queues.model import (
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    PriorityClass,
    Queue,
    QueueSet,
    changes,
    partitioned,
    scheduled_in,
)

__all__ = ["DEFAULT_PRIORITY", "DEFAULT_QUEUE", "PriorityClass", "Queue", "QueueSet",
           "changes", "partitioned", "scheduled_in"]
