"""Input-gradient attacks, robustness evaluation, adversarial training and sensitivity analysis.

Builds on the shared core :mod:`robustgrad`; knows nothing of RL agents.
"""

# The public names of the package; importing `training` registers AdversarialTrainer for .keras loading.
from . import certify, norms, objectives, sensitivity, training  # noqa: F401
from ._base import Attack, AttackResult, check_classification_data, select_output  # noqa: F401
from .apgd import APGD, apgd  # noqa: F401
from .certification import CertifyConfig, certify_run  # noqa: F401
from .certify import (  # noqa: F401
    margin_lower_bounds,
    smooth_certify,
    smooth_predict,
    verified_accuracy,
    verified_mask,
)
from .cw import CarliniWagnerL2, carlini_wagner_l2  # noqa: F401
from .deepfool import DeepFool, deepfool  # noqa: F401
from .evaluate import AttackRecord, EvaluationReport, evaluate  # noqa: F401
from .evaluation_run import EvaluationConfig, evaluate_run  # noqa: F401
from .fab import FAB, fab  # noqa: F401
from .fgsm import FGM, FGSM, fast_gradient_method  # noqa: F401
from .pgd import (  # noqa: F401
    BIM,
    MIM,
    PGD,
    basic_iterative_method,
    momentum_iterative_method,
    projected_gradient_descent,
)
from .registry import ATTACK_NAMES, describe_attacks, make_attack, parse_attack, parse_attacks  # noqa: F401
from .sensitivity import (  # noqa: F401
    class_jacobian_norms,
    jacobian_spectral_norm,
    local_lipschitz,
    saliency,
    smoothgrad,
)
from .square import Square, square  # noqa: F401
from .training import (  # noqa: F401
    ARCHITECTURES,
    AdversarialTrainer,
    CatastrophicOverfittingGuard,
    EpochCheckpoint,
    make_classifier,
    make_model,
)

__all__ = [
    "APGD", "ARCHITECTURES", "ATTACK_NAMES", "AdversarialTrainer", "Attack", "AttackRecord",
    "AttackResult", "BIM", "CarliniWagnerL2", "CatastrophicOverfittingGuard", "CertifyConfig",
    "DeepFool", "EpochCheckpoint", "EvaluationConfig", "EvaluationReport", "FAB", "FGM", "FGSM",
    "MIM", "PGD", "Square", "apgd", "basic_iterative_method", "carlini_wagner_l2", "certify",
    "certify_run", "check_classification_data", "class_jacobian_norms", "deepfool",
    "describe_attacks", "evaluate", "evaluate_run", "fab", "fast_gradient_method",
    "jacobian_spectral_norm", "local_lipschitz", "make_attack", "make_classifier", "make_model",
    "margin_lower_bounds", "momentum_iterative_method", "norms", "objectives", "parse_attack",
    "parse_attacks", "projected_gradient_descent", "saliency", "select_output", "sensitivity",
    "smooth_certify", "smooth_predict", "smoothgrad", "square", "training", "verified_accuracy",
    "verified_mask",
]
