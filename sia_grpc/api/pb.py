"""Every message and enum value of the `sia.v1` package, flat: `pb.JobSpec`,
`pb.JOB_STATE_QUEUED`. A module (not a namespace built at run time) so that a type
checker sees each name, through the generated stubs (`*_pb2.pyi`)."""

# ruff: noqa: F403
from sia_grpc._proto.sia.v1.agent_service_pb2 import *
from sia_grpc._proto.sia.v1.cluster_service_pb2 import *
from sia_grpc._proto.sia.v1.event_pb2 import *
from sia_grpc._proto.sia.v1.goodput_pb2 import *
from sia_grpc._proto.sia.v1.job_pb2 import *
from sia_grpc._proto.sia.v1.job_service_pb2 import *
from sia_grpc._proto.sia.v1.policy_service_pb2 import *
from sia_grpc._proto.sia.v1.queue_pb2 import *
from sia_grpc._proto.sia.v1.worker_service_pb2 import *

del DESCRIPTOR  # (each file's; the last one's otherwise, which means nothing here)  # noqa: F821
