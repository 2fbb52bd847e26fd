"""kiln's export front end: torch.export a model into a .pt2 plus a model_spec.json.

This is the upstream "preparation step" of the kiln workflow. It is the only
place besides tests and benchmarks where PyTorch is used.
"""
