"""kvclaims: auditable resident KV claims for vLLM (command-line facade)."""
