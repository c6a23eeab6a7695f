"""Quantized layers: vLLM LinearMethods / FusedMoE methods and Hugging Face nn.Module replacements."""
