"""robustgrad.monitor (being written)."""
