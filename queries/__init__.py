"""kvclaims queries."""
