"""The controller's state machine: pure and synchronous, no I/O.

`state.ControllerState.handle(event) -> actions` is the whole of the controller's
decisions. Its parts: `events` (what comes in, what goes out), `books` (the state,
declared once, in seven books), `records` (a job's and a node's record),
`transitions` (the job states and the table of changes between them), `invariants`
(the rules checked after every event), and the handlers, one module per concern,
each over the books it declares it changes: `agents` (what agents say), `ledger`
(who holds which GPU), `rounds` (a tick becomes a solve, a solve becomes moves),
`moves` (two-phase moves, preemptions, lost agents), `profiling` (the bootstrap
passes), `views` (what the API shows) and `validation` (the controller's own checks
of a submission). The async shell (`controller/shell/`) drives it.
"""
