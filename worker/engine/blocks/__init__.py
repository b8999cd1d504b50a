"""Per-block measurements beside the profile step and the timing pass: the blocks' inputs
as a checkpoint keeps them, which blocks are the same computation, and what a block
checkpointed under a selective policy keeps and holds; and ``auto``'s compiled candidates,
the whole step or the chain of blocks under torch.compile's own budget, measured the same
way (issue 31)."""
