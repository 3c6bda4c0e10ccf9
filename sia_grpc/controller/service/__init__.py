"""The controller's gRPC services: `services` (JobService, ClusterService,
AgentService: each RPC checks who calls and what it asks, then calls the controller
through the `ControllerApi` protocol) and `policy_service` (PolicyService: Sia's
decision as one stateless call, for other orchestrators)."""
