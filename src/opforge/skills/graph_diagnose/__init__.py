"""graph-diagnose: where and why torch.compile fails, layer by layer, and what to do about it."""
