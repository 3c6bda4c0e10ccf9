"""Per-job isolation on the node agent."""
