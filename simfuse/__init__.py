"""simfuse: fused multi-step GPU simulators for RL data collection, as Gymnasium vector envs."""
