"""Building models: built-in kinds, plugins, Hugging Face and torchvision models, a user's own model."""
