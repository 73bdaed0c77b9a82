"""kvclaims recorder."""
