"""robustgrad.regularizers (being written)."""
