"""CPU backend: the reference ops, plus PyTorch's fused int4 CPU matmul for awq_orin."""
