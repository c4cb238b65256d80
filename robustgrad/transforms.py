"""robustgrad.transforms (being written)."""
