"""kvclaims dashboard."""
