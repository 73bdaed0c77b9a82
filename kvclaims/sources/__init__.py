"""Sources that produce run directories outside a recording vLLM engine.

Importers (JSON Lines, the paper prototype's traces), the stock-vLLM KV-events listener,
synthetic generators and the demo scenarios (which drive vLLM with the recorder attached).
They write through ``kvclaims.contract`` and never reach into the reconstructor.
"""
