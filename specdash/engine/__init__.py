"""The native engine: model, row ops, GEMM backends, state, CUDA graphs, drafters."""
