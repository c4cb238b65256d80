"""Input-gradient attacks, robustness evaluation, adversarial training and sensitivity analysis.

Builds on the shared core :mod:`robustgrad`; knows nothing of RL agents.
"""

# --- BEGIN attacks (norms, objectives, attacks, evaluation) ---
# --- END attacks ---

# --- BEGIN training (adversarial training) ---
# --- END training ---

# --- BEGIN sensitivity ---
# --- END sensitivity ---
