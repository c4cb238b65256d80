"""Adversarial training of classifiers, Keras-native.

:class:`AdversarialTrainer` is a ``keras.Model`` that wraps a classifier (any Keras model
returning logits) and replaces ``train_step`` with an adversarial one, so ``compile()``,
``fit()``, callbacks, ``tf.distribute`` strategies and the ``.keras`` format all work as usual::

    import attacks, keras
    clf = attacks.training.make_classifier((8, 8, 1), 10)
    trainer = attacks.AdversarialTrainer(clf, method="madry", eps=0.1, steps=10)
    trainer.compile(optimizer=keras.optimizers.Adam(1e-3))
    trainer.fit(x_train, y_train, batch_size=64, epochs=40, validation_data=(x_test, y_test))
    clf.save("robust.keras")                 # the plain classifier, no custom objects
    trainer.save("trainer.keras")            # the trainer; load it after ``import attacks``

One concept per module:

* :mod:`~attacks.training.trainer` -- :class:`AdversarialTrainer` and its ``train_step``;
* :mod:`~attacks.training.options` -- the trainer's options in typed groups
  (:class:`CraftingOptions`, :class:`LossOptions`, :class:`UpdateOptions`,
  :class:`ScheduleOptions`);
* :mod:`~attacks.training.methods` -- madry, trades, fast, free, mart, awp, clean as objects
  with one ``craft`` and one ``loss``, with the papers (certified training in
  :mod:`~attacks.training.certified`, Gaussian augmentation in :mod:`~attacks.training.noise`);
* :mod:`~attacks.training.context` -- :class:`StepContext`, all a method sees of a step;
* :mod:`~attacks.training.registry` -- the methods by name (:data:`METHODS`,
  :data:`DEFAULT_STEPS`, :func:`get_method`, :func:`register_method`);
* :mod:`~attacks.training.smoothadv` -- SmoothAdv (Salman et al. 2019): the attack on the
  smoothed classifier :func:`smoothadv_attack`, :func:`smoothed_cross_entropy`;
* :mod:`~attacks.training.crafting` -- the attack engine inside the training graph,
  :func:`robust_accuracy`;
* :mod:`~attacks.training.models` -- :func:`make_classifier`, :func:`freeze_layers`,
  :func:`check_classifier`;
* :mod:`~attacks.training.architectures` -- :func:`make_model` by name (:data:`ARCHITECTURES`):
  the small CNN, an MLP, PreActResNet-18, WideResNets;
* :mod:`~attacks.training.recompute` -- gradient checkpointing of a functional model's
  training-mode pass (``recompute="activations"``, the default: :func:`recomputed_activations_call`,
  :func:`activation_groups`; ``recompute="blocks"``: :func:`checkpointed_call`,
  :func:`checkpoint_segments`);
* :mod:`~attacks.training.data` -- the resumable pipeline :func:`epoch_dataset`, the
  augmentation :func:`augment_dataset` / :func:`random_crop_flip`;
* :mod:`~attacks.training.callbacks` -- :class:`CatastrophicOverfittingGuard`,
  :class:`RobustEarlyStopping`, :class:`EpochCheckpoint`, :class:`NonFiniteGuard`,
  :class:`ScalarLogger`, :class:`EpochTimer`, :class:`WeightAveraging`;
* :mod:`~attacks.training.schedules` -- :func:`learning_rate_schedule` (constant, cosine,
  cyclic, piecewise) and :func:`make_optimizer` (Adam, SGD with momentum);
* :mod:`~attacks.training.recipes` -- the published recipes as data (``recipes.json``),
  :func:`resolve_settings`;
* :mod:`~attacks.training.config` -- :class:`ClassifierConfig`, the typed settings of a run,
  resolved from method defaults, recipes and the fields set, with provenance;
* :mod:`~attacks.training.run` -- :func:`train_classifier`, one whole resumable run in a
  :class:`robustgrad.rundir.RunDirectory` (what ``robustgrad train-classifier`` calls);
  :mod:`~attacks.training.history` its ``history.json``.

>>> "madry" in METHODS and DEFAULT_STEPS["free"] == 4
True
"""

from .architectures import (
    ARCHITECTURES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    ibp_small,
    make_model,
    mlp,
    preact_resnet18,
    wide_resnet,
)
from .callbacks import (
    CatastrophicOverfittingGuard,
    EpochCheckpoint,
    EpochTimer,
    NonFiniteGuard,
    RobustEarlyStopping,
    ScalarLogger,
    WeightAveraging,
)
from .certified import worst_case_logits
from .config import ClassifierConfig
from .context import StepContext
from .crafting import robust_accuracy, robust_correct
from .data import augment_dataset, epoch_dataset, random_crop_flip, steps_per_epoch
from .methods import StepOutputs, TrainingMethod
from .models import check_classifier, freeze_layers, make_classifier
from .options import CraftingOptions, LossOptions, ScheduleOptions, UpdateOptions
from .recipes import find_recipe, list_recipes, resolve_settings
from .recompute import activation_groups, checkpoint_segments, checkpointed_call, recomputed_activations_call
from .registry import (
    CERTIFIED_METHODS,
    DEFAULT_STEPS,
    METHODS,
    get_method,
    register_method,
    registered_methods,
    unregister_method,
)
from .run import TrainedClassifier, train_classifier
from .run_settings import SavedRun, resolve_run_settings
from .schedules import OPTIMIZERS, SCHEDULES, learning_rate_schedule, make_optimizer
from .smoothadv import smoothadv_attack, smoothed_cross_entropy
from .trainer import AdversarialTrainer

__all__ = [
    "ARCHITECTURES",
    "CERTIFIED_METHODS",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DEFAULT_STEPS",
    "METHODS",
    "OPTIMIZERS",
    "SCHEDULES",
    "AdversarialTrainer",
    "CatastrophicOverfittingGuard",
    "ClassifierConfig",
    "CraftingOptions",
    "EpochCheckpoint",
    "EpochTimer",
    "LossOptions",
    "NonFiniteGuard",
    "RobustEarlyStopping",
    "SavedRun",
    "ScheduleOptions",
    "ScalarLogger",
    "StepContext",
    "StepOutputs",
    "TrainedClassifier",
    "TrainingMethod",
    "UpdateOptions",
    "WeightAveraging",
    "activation_groups",
    "augment_dataset",
    "check_classifier",
    "checkpoint_segments",
    "checkpointed_call",
    "epoch_dataset",
    "find_recipe",
    "freeze_layers",
    "get_method",
    "ibp_small",
    "learning_rate_schedule",
    "list_recipes",
    "make_classifier",
    "make_model",
    "make_optimizer",
    "mlp",
    "preact_resnet18",
    "random_crop_flip",
    "recomputed_activations_call",
    "register_method",
    "registered_methods",
    "resolve_run_settings",
    "resolve_settings",
    "robust_accuracy",
    "robust_correct",
    "smoothadv_attack",
    "smoothed_cross_entropy",
    "steps_per_epoch",
    "train_classifier",
    "unregister_method",
    "wide_resnet",
    "worst_case_logits",
]
