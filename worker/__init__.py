"""The ckptlab worker: runs checkpointing experiments with PyTorch and records them."""
