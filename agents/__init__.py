"""RL agents on gymnasium and tensorflow-probability, observation attacks and robust training.

Builds on :mod:`robustgrad` and :mod:`attacks`.
"""

# --- BEGIN agents ---
# --- END agents ---
