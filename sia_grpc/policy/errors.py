"""The core's typed errors (no imports: every policy module may raise them)."""

from __future__ import annotations


class FieldError(ValueError):
    """A core value that cannot be used: `field` names it (the core's own field
    name, e.g. `min_gpus`, `node.name`), `problem` says why. The wire layer maps the
    field onto the request's (`sia_grpc.api.convert`) without parsing messages."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")
