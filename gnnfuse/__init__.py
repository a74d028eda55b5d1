"""gnnfuse: fused attention-GNN layers (GAT, GATv2, Graph Transformer, AGNN) in Triton."""
