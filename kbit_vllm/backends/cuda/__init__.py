"""CUDA backend: ctypes calls into libkbit_vllm.so. The only place that touches the library."""
