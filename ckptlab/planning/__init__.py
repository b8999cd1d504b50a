"""Strategy ``auto``'s planning: a chain of profiled blocks and the search over its splits."""
