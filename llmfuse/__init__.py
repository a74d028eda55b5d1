"""llmfuse: fused Llama decoder kernels and a looped persistent decode kernel."""
