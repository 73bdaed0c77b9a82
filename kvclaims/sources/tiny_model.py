"""Build the tiny random-weight Llama that the demo, the tests and the sweeps run on.

Nothing is downloaded: the model is created from a config and saved to a local folder. KV block
behaviour does not depend on the weights (docs/design.md), so random weights are enough.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# NOTE: the CPU backend needs head_dim >= 64 (hidden / heads) and block_size a multiple of 32.
TINY_CONFIG: dict[str, int] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "max_position_embeddings": 8192,
}


def default_model_dir() -> Path:
    """Where the tiny model lives: ``$KVCLAIMS_MODEL_DIR`` or ``~/.cache/kvclaims/tiny-llama``."""
    env = os.environ.get("KVCLAIMS_MODEL_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kvclaims" / "tiny-llama"


def ensure_tiny_model(model_dir: Path | None = None) -> Path:
    """Create the tiny model in ``model_dir`` unless a matching one is already there."""
    model_dir = Path(model_dir or default_model_dir())
    marker = model_dir / "kvclaims-tiny.json"
    if marker.exists() and json.loads(marker.read_text()) == TINY_CONFIG:
        return model_dir
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY_CONFIG, torch_dtype="float32", tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    marker.write_text(json.dumps(TINY_CONFIG))
    return model_dir
