"""Input-gradient attacks, robustness evaluation, adversarial training and sensitivity analysis.

Builds on the shared core :mod:`robustgrad`; knows nothing of RL agents.
"""

# --- BEGIN attacks (norms, objectives, attacks, evaluation) ---
from . import norms, objectives  # noqa: E402,F401
from ._base import Attack, AttackResult  # noqa: E402,F401
from .fgsm import FGM, FGSM, fast_gradient_method  # noqa: E402,F401
from .pgd import (  # noqa: E402,F401
    BIM,
    MIM,
    PGD,
    basic_iterative_method,
    momentum_iterative_method,
    projected_gradient_descent,
)
# --- END attacks ---

# --- BEGIN training (adversarial training) ---
# --- END training ---

# --- BEGIN sensitivity ---
from . import sensitivity  # noqa: E402,F401
from .sensitivity import (  # noqa: E402,F401
    class_jacobian_norms,
    jacobian_spectral_norm,
    local_lipschitz,
    saliency,
    smoothgrad,
)
# --- END sensitivity ---
