"""vLLM and Hugging Face quantization configs for kbit and awq_orin."""
