"""Running an experiment: the engine, a run's passes, the training step, strategies, gradient check."""
