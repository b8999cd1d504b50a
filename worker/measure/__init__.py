"""Measuring memory: the live-tensor tracker and meter, the CPU allocator probe, the host-memory cap."""
