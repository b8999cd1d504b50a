"""Predictions ("will it fit?"): the devices a run can be predicted for and what a prediction
states beside the figures a real run measures. Pure data, no torch."""
