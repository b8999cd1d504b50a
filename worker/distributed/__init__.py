"""Sharded training (``spec.distributed``: DDP or FSDP2): one process per rank
(:mod:`.launch`), the model wrapped and the collectives' memory tagged on each
(:mod:`.shard`), the gradients checked against one process (:mod:`.gradcheck`)."""

from ckptlab.worker.distributed.launch import combine, run_distributed

__all__ = ["run_distributed", "combine"]
