"""kvclaims reconstruct."""
