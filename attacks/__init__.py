"""Input-gradient attacks, robustness evaluation, adversarial training and sensitivity analysis.

Builds on the shared core :mod:`robustgrad`; knows nothing of RL agents.
"""

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
from .apgd import APGD, apgd  # noqa: E402,F401
from .cw import CarliniWagnerL2, carlini_wagner_l2  # noqa: E402,F401
from .deepfool import DeepFool, deepfool  # noqa: E402,F401
from .square import Square, square  # noqa: E402,F401
from .registry import ATTACK_NAMES, describe_attacks, make_attack, parse_attack, parse_attacks  # noqa: E402,F401,E501
from .evaluate import AttackRecord, EvaluationReport, evaluate  # noqa: E402,F401
from . import training  # noqa: E402,F401  (registers AdversarialTrainer for .keras loading)
from .training import (  # noqa: E402,F401
    AdversarialTrainer,
    CatastrophicOverfittingGuard,
    EpochCheckpoint,
    make_classifier,
)
from . import sensitivity  # noqa: E402,F401
from .sensitivity import (  # noqa: E402,F401
    class_jacobian_norms,
    jacobian_spectral_norm,
    local_lipschitz,
    saliency,
    smoothgrad,
)
