"""The controller's async shell: everything that waits on I/O around the state machine.

`server.Controller` is assembled from parts, one per module, over the typed
attributes of `base.ShellBase`: `listeners` (ports, TLS, tokens, SIGHUP), `creates`
(CreateJob's group commits), `agent_streams` (one stream per node), `round_log`
(publishing rounds), `leadership` (leader election on the shared store, and the gate
that answers for the leader). Beside them: `solver_pool` (the policy off the event
loop), `exclusive` (one controller per store and per address), `limits` (tenants'
admission limits). The gRPC servicers they serve are `controller/service/`; the
durable state is `controller/stores/`.
"""
