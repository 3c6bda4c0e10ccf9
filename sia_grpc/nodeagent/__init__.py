"""The node agent: a daemon per node that holds one stream to the controller,
applies its placement directives to workers, and streams telemetry up.

    config = AgentConfig(node_id="n1", controller="ctl:50051", gpu_type="rtx", num_gpus=8)
    async with NodeAgent(config) as agent:   # modeled workers by default
        await agent.run()

Real workers (`TorchBackend`, `--backend torch`) run each job's command as one
process per GPU; `--emulate TYPE:COUNT` runs them on the CPU instead (emulation,
not a GPU node). See docs/agent.md.

Command line: `python -m sia_grpc.nodeagent --controller HOST:PORT --gpus rtx:8`.
"""

from sia_grpc.clock import Clock, ManualClock, MonotonicClock
from sia_grpc.nodeagent.agent import AgentStatus, NodeAgent
from sia_grpc.nodeagent.backend import ExitCallback, Launch, WorkerBackend
from sia_grpc.nodeagent.config import AgentConfig, AgentConfigError, full_jitter_backoff
from sia_grpc.nodeagent.directives import ACK_MEMORY
from sia_grpc.nodeagent.modeled import PROFILE_STEPS, ModeledBackend, Trajectory
from sia_grpc.nodeagent.torchbackend import TorchBackend

__all__ = [
    "ACK_MEMORY", "AgentConfig", "AgentConfigError", "AgentStatus", "Clock", "ExitCallback",
    "Launch", "ManualClock", "ModeledBackend", "MonotonicClock", "NodeAgent", "PROFILE_STEPS",
    "TorchBackend", "Trajectory", "WorkerBackend", "full_jitter_backoff",
]
