"""The experiment spec and what bounds it: spec models, model catalogues, limits, presets, sweeps."""
