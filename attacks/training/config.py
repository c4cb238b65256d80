"""The typed configuration of a classifier training run (as :class:`agents.core.config.AgentConfig`
is for agents).

:class:`ClassifierConfig` is a frozen dataclass with one documented field per setting of a run:
data and model, the training method, optimisation, devices and the final evaluation. A field left
``None`` is *unset*: :meth:`ClassifierConfig.resolve` fills it from, in this order, the method's
defaults, the matching published recipe (``recipes.json``, keyed by these fields) and the fields
the user set, and keeps where every value came from (:attr:`ClassifierConfig.resolved`, written
to the run's ``config.json`` under ``"resolved"``).

The field names are the ``train-classifier`` flags, underscored (``--step-size`` is
``step_size``), so a ``config.json`` written by the command line, by Python or by earlier
versions is the same record (:meth:`ClassifierConfig.from_record`,
:meth:`ClassifierConfig.to_record`), and a resumed run keeps its settings
(:meth:`ClassifierConfig.inherit`).

>>> config = ClassifierConfig(method="fast", data="mnist", epochs=3).resolve()
>>> config.eps, config.epochs, config.lr, config.recipe_name
(0.3, 3, 0.005, 'wong2020-fast-mnist')
>>> config.origin["eps"], config.origin["epochs"], config.origin["momentum"]
('recipe', 'user', 'default')
>>> ClassifierConfig(method="madry", eps=-1)
Traceback (most recent call last):
robustgrad.errors.ConfigError: eps must be a number > 0, got -1
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol, cast

from robustgrad import checks
from robustgrad.errors import ConfigError

from .method_options import CONFIG_OPTIONS, check_applicable
from .options import convolution_mode, recompute_mode
from .recipes import SETTING_KEYS, ResolvedSettings, method_defaults
from .registry import get_method
from .run_settings import SavedRun, resolve_run_settings

__all__ = ["CERTIFIED", "METHODS", "RESUME_FREE", "SETTING_FIELDS", "ClassifierConfig",
           "ResolvedConfig"]

METHODS = ("madry", "trades", "fast", "free", "mart", "awp", "ibp", "crown-ibp", "clean",
           "gaussian", "smoothadv")
"""The training methods (:data:`attacks.training.METHODS` and the certified ones)."""

CERTIFIED = ("ibp", "crown-ibp")
"""The methods that bound the model (certified training): architecture ``ibp-small`` by default."""

SETTING_FIELDS: tuple[str, ...] = tuple(k for k in SETTING_KEYS if k not in ("warmup", "boundaries"))
"""The fields a recipe or a method default may fill (a run given them as flags); ``warmup`` and
``boundaries`` (the schedule's shape) are recipe settings with no flag."""

RESUME_FREE = frozenset({
    "resume", "overwrite", "export", "verbose", "eval_attacks", "eval_eps", "resolved",
    "val_size", "val_steps", "eval_limit", "out", "no_eval", "strategy", "logical_cpus",
    "no_progress", "show_native_log", "threads", "override", "overrides", "recompute",
    "convolutions", "stop_after_steps"})  # (a hidden test flag of earlier versions, in old configs)
"""Record keys a resumed run may change freely: how it uses the machine, where and how much it
reports; every other key is held to the one resume rule (:meth:`robustgrad.rundir.RunDirectory.
resume_changes`)."""

DEFAULT_WIDTH = 64
"""Channels of the first conv layer of ``cnn`` and ``preactresnet18`` when ``width`` is unset."""

_DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "svhn")  # attacks.data


@dataclass(frozen=True)
class ClassifierConfig:
    """Every setting of a classifier training run; ``None`` leaves a setting to the method's
    defaults and the recipe (:meth:`resolve`). Field names are the ``train-classifier`` flags."""

    # ---- data and model
    data: str = "digits"
    """A dataset name (:data:`attacks.data.DATASETS`) or a path (.npz, a directory, images)."""
    no_download: bool = False
    """Never download a named dataset."""
    limit: int | None = None
    """Use only the first ``limit`` training examples."""
    arch: str | None = None
    """Architecture name (:data:`attacks.training.ARCHITECTURES`); default ``cnn`` (certified
    methods: ``ibp-small``); ``None`` with ``init_from``."""
    width: int | None = None
    """Channels of the first conv layer of ``cnn`` and ``preactresnet18`` (unset: 64)."""
    init_from: str | None = None
    """A ``.keras`` classifier (logits output) to start from instead of a new one."""
    freeze: str | None = None
    """Comma-separated layer names or globs to freeze (prefix ``re:`` for a regex)."""
    augment: bool | None = None
    """Pad-4 random crops, and flips for colour images."""
    # ---- method
    method: str = "madry"
    """One of :data:`METHODS`."""
    recipe: str | None = None
    """``auto`` (default: the recipe of this method, dataset and architecture), ``none`` or a
    recipe's name (:func:`attacks.training.list_recipes`)."""
    eps: float | None = None
    """Perturbation budget of the training attack (input units)."""
    norm: str | None = None
    """``linf`` or ``l2``; unset: ``l2`` for smoothadv, else ``linf``."""
    sigma: float | None = None
    """smoothadv: std of the smoothing noise."""
    noise_draws: int | None = None
    """smoothadv: noise draws per example."""
    steps: int | None = None
    """PGD steps (free: replays)."""
    step_size: float | None = None
    """Attack step (default from eps and steps)."""
    beta: float | None = None
    """TRADES / MART KL weight."""
    awp_gamma: float | None = None
    """awp: relative size of the weight perturbation."""
    adv_ratio: float = 1.0
    """Weight of the adversarial loss against the clean loss."""
    warmup_epochs: float | None = None
    """Epochs over which eps ramps up from 0."""
    warmup_delay_epochs: float | None = None
    """Epochs at eps 0 before the ramp."""
    kappa_final: float | None = None
    """ibp / crown-ibp: weight of the clean loss at full eps."""
    beta_final: float | None = None
    """crown-ibp: weight of the CROWN-IBP bound at full eps."""
    no_random_start: bool = False
    """Start attacks at x."""
    craft_training: bool = False
    """Craft attacks with the model in training mode."""
    no_guard: bool = False
    """fast: no catastrophic-overfitting guard."""
    # ---- optimisation
    epochs: int | None = None
    """Epochs of training."""
    batch_size: int | None = None
    """Global batch size."""
    optimizer: str | None = None
    """``adam`` or ``sgd``."""
    lr: float | None = None
    """Peak learning rate."""
    schedule: str | None = None
    """``constant``, ``cosine``, ``cyclic`` or ``piecewise``."""
    momentum: float | None = None
    """SGD momentum."""
    weight_decay: float | None = None
    """L2 weight decay added to the gradient."""
    label_smoothing: float | None = None
    """Label smoothing of the training loss."""
    ema: float | None = None
    """Decay of the weights' moving average saved as the model (0: off)."""
    early_stop: bool | None = None
    """Robust early stopping on ``val_size`` held-out training examples."""
    warmup: float | None = None
    """cyclic schedule: the fraction of the run spent rising (a recipe setting, no flag)."""
    boundaries: tuple[float, ...] | None = None
    """piecewise schedule: the fractions of the run where the rate drops x0.1 (no flag)."""
    max_grad_norm: float = 10.0
    """Clip the global gradient norm (0: off)."""
    grad_accum: int = 1
    """Accumulate gradients over this many batches per update."""
    mixed_precision: bool = False
    """mixed_float16 compute with dynamic loss scaling."""
    recompute: str = "activations"
    """What the update's backward pass recomputes instead of keeping (``AdversarialTrainer(
    recompute=...)``): ``activations`` (batch norm + ReLU; no more time), ``blocks`` (each
    residual block, and freed memory returned to the system at once: less memory, more time),
    ``none``; the same weights in every mode."""
    convolutions: str = "auto"
    """How the training step's wide 3x3 convolutions compute (``AdversarialTrainer(
    convolutions=...)``): ``auto`` (Winograd on a host without a GPU), ``winograd``, ``direct``
    (TensorFlow's; Winograd's weights equal them to float rounding only)."""
    seed: int = 0
    """The run's seed (weights, data order, attacks)."""
    no_deterministic: bool = False
    """Do not enable TensorFlow op determinism."""
    # ---- devices and evaluation
    strategy: str = "none"
    """``none``, ``mirrored`` or ``multiworker``."""
    logical_cpus: int = 0
    """mirrored on a CPU-only host: split the CPU into this many logical devices."""
    val_size: int = 512
    """Examples of the per-epoch validation."""
    val_steps: int = 10
    """PGD steps of the per-epoch robust validation (0: clean only)."""
    eval_attacks: str = "pgd50x5,apgd-ce,apgd-t,square"
    """Attacks of the final report (:func:`attacks.parse_attacks`)."""
    eval_eps: str | None = None
    """Comma-separated eps of the final report (default ``eps``)."""
    eval_limit: int | None = None
    """Evaluate on the first ``eval_limit`` test examples only."""
    no_eval: bool = False
    """Skip the final robustness report."""
    resolved: dict | None = field(default=None, compare=False, repr=False)
    """After :meth:`resolve`: ``{"values", "origin", "recipe", "source"}``, where each setting
    came from (``"default"``, ``"recipe"`` or ``"user"``); ``None`` before."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        self._check_applicable()
        if self.norm not in (None, "linf", "l2"):
            raise ConfigError(f"norm must be linf or l2, got {self.norm!r}")
        if self.norm is None:  # smoothadv attacks the smoothed classifier in L2
            object.__setattr__(self, "norm", "l2" if self.method == "smoothadv" else "linf")
        if self.method == "smoothadv" and self.norm != "l2":
            raise ConfigError("norm: smoothadv attacks the smoothed classifier in L2; use l2")
        if self.width is None:
            object.__setattr__(self, "width", DEFAULT_WIDTH)
        if isinstance(self.boundaries, list):
            object.__setattr__(self, "boundaries", tuple(self.boundaries))
        # robustgrad.checks raise ConfigError naming the field
        checks.number(self.eps, "eps", minimum=0, min_inclusive=False, allow_none=True)
        checks.positive_int(self.epochs, "epochs", allow_none=True)
        checks.positive_int(self.batch_size, "batch_size", allow_none=True)
        checks.positive_int(self.steps, "steps", minimum=0, allow_none=True)  # 0: no attack
        checks.number(self.lr, "lr", minimum=0, min_inclusive=False,
                      maximum=checks.MAX_LEARNING_RATE, allow_none=True)
        checks.positive_int(self.val_size, "val_size", minimum=0)
        checks.positive_int(self.val_steps, "val_steps", minimum=0)
        checks.positive_int(self.grad_accum, "grad_accum")
        checks.probability(self.adv_ratio, "adv_ratio")
        checks.nonnegative(self.max_grad_norm, "max_grad_norm")
        checks.number(self.beta, "beta", minimum=0, maximum=checks.MAX_LOSS_WEIGHT,
                      allow_none=True)
        checks.number(self.awp_gamma, "awp_gamma", minimum=0, maximum=checks.MAX_AWP_GAMMA,
                      allow_none=True)
        checks.number(self.weight_decay, "weight_decay", minimum=0,
                      maximum=checks.MAX_WEIGHT_DECAY, allow_none=True)
        checks.positive_int(self.limit, "limit", minimum=2, allow_none=True)
        try:  # True/False: the earlier boolean flag, in old records
            object.__setattr__(self, "recompute", recompute_mode(self.recompute))
            convolution_mode(self.convolutions)
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from None


    def _check_applicable(self) -> None:
        """A method option set (not unset, nor the method's default) for a method that does not
        read it is refused, naming it (:mod:`attacks.training.method_options`)."""
        unset = {f.name: f.default for f in dataclasses.fields(self)}
        method_default = method_defaults(self.method)
        accepted = {k: [unset[k], method_default.get(k, unset[k])] for k in CONFIG_OPTIONS}
        # a run records the steps and step size its trainer used (the method's own defaults)
        impl = get_method(self.method)
        accepted["steps"].append(impl.default_steps)
        if isinstance(self.eps, (int, float)) and not isinstance(self.eps, bool):
            accepted["step_size"].append(impl.default_step_size(float(self.eps),
                                                                impl.default_steps))
        check_applicable(self.method, {k: getattr(self, k) for k in CONFIG_OPTIONS}, accepted)

    # ---- reading and writing the record
    @classmethod
    def from_record(cls, record: dict) -> ClassifierConfig:
        """The config of a record (``config.json``, or the command line's flags): its keys that
        are fields; the others (``out``, ``resume``, ...) belong to the run, not the config."""
        names = {f.name for f in dataclasses.fields(cls)} - {"resolved"}
        return cls(**{k: v for k, v in record.items() if k in names})

    def to_record(self) -> dict:
        """The fields as the JSON record of ``config.json`` (without :attr:`resolved`)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("resolved", "warmup", "boundaries")}
        return out

    # ---- settings
    @property
    def certified(self) -> bool:
        """Whether the method bounds the model (IBP, CROWN-IBP)."""
        return self.method in CERTIFIED

    @property
    def architecture(self) -> str | None:
        """The architecture a new model gets (``None`` with ``init_from``)."""
        if self.init_from:
            return None
        return self.arch or ("ibp-small" if self.certified else "cnn")

    @property
    def origin(self) -> dict:
        """Per setting, where its value came from (empty before :meth:`resolve`)."""
        return dict((self.resolved or {}).get("origin", {}))

    @property
    def recipe_name(self) -> str | None:
        """The recipe applied by :meth:`resolve` (None when none did, or before)."""
        return (self.resolved or {}).get("recipe")

    def settings(self) -> ResolvedSettings:
        """:attr:`resolved` as :class:`attacks.training.recipes.ResolvedSettings` (the values
        are this config's)."""
        if self.resolved is None:
            raise ConfigError("the config is not resolved yet: call resolve() first")
        r = self.resolved
        return ResolvedSettings(dict(r["values"]), dict(r["origin"]), r.get("recipe"),
                                r.get("source"))

    def inherit(self, saved: SavedRun | dict) -> ClassifierConfig:
        """A resumed run keeps its settings: every setting (and ``recipe``) left ``None`` here
        takes the saved run's value (the one it resolved, for a setting it had left unset)."""
        saved = saved if isinstance(saved, SavedRun) else SavedRun.of(saved)
        given = {k: getattr(self, k) for k in (*SETTING_FIELDS, "recipe")}
        return dataclasses.replace(self, **saved.inherited(given))

    def resolve(self, saved: SavedRun | dict | None = None) -> ClassifierConfig:
        """Every unset setting filled: method defaults < recipe < the fields set here; on resume
        (``saved``: the run's :class:`~attacks.training.run_settings.SavedRun` or
        ``config.json``) the values the run resolved when it started win over anything not set
        here. Returns a new config whose :attr:`resolved` says where each value came from;
        ``ConfigError`` for an unknown or mismatched recipe."""
        if isinstance(saved, dict):
            saved = SavedRun.of(saved)
        dataset = self.data if self.data in _DATASETS else None
        user = {k: getattr(self, k) for k in SETTING_FIELDS}
        try:
            s = resolve_run_settings(self.method, dataset, self.architecture, user,
                                     recipe=self.recipe, saved=saved, certified=self.certified)
        except ValueError as exc:  # an unknown recipe, or one for another method
            raise ConfigError(f"--recipe: {exc}") from exc
        values = {k: s.values[k] for k in SETTING_KEYS}
        inherited = saved is not None and saved.values.get("momentum") == self.momentum
        if self.momentum is not None and values["optimizer"] != "sgd" and not inherited:
            # a momentum the optimizer would ignore (a resumed run's own value is not the user's)
            chosen = ("you chose" if s.origin.get("optimizer") == "user" else
                      f"the recipe {s.recipe!r} picks" if s.origin.get("optimizer") == "recipe"
                      else f"--method {self.method}'s default is")
            raise ConfigError(f"--momentum: SGD's momentum, but {chosen} --optimizer "
                              f"{values['optimizer']}, which has none: add --optimizer sgd to "
                              "use it, or leave --momentum out")
        values["boundaries"] = tuple(values["boundaries"] or ())
        return dataclasses.replace(self, **values, resolved=s.as_record())

    def resolved_view(self) -> ResolvedConfig:
        """This config as a :class:`ResolvedConfig` (every setting set), for code that needs
        the values; ``ConfigError`` naming the settings still unset (call :meth:`resolve`)."""
        unset = [k for k in (*SETTING_KEYS, "norm", "width")
                 if getattr(self, k) is None and k not in ("steps", "step_size")]
        if unset or self.resolved is None:
            raise ConfigError(f"the config is not resolved ({', '.join(unset) or 'resolved'} "
                              "unset): call resolve() first")
        return cast(ResolvedConfig, self)


class ResolvedConfig(Protocol):
    """What a resolved config (:meth:`ClassifierConfig.resolve`) guarantees to the type checker:
    the settings are set (``steps`` and ``step_size`` may stay ``None``: the trainer's defaults).
    :meth:`ClassifierConfig.resolved_view` checks it and returns the config as one."""

    data: str
    no_download: bool
    limit: int | None
    arch: str | None
    width: int
    init_from: str | None
    freeze: str | None
    augment: bool
    method: str
    recipe: str | None
    eps: float
    norm: str
    sigma: float
    noise_draws: int
    steps: int | None
    step_size: float | None
    beta: float
    awp_gamma: float
    adv_ratio: float
    warmup_epochs: float
    warmup_delay_epochs: float
    kappa_final: float
    beta_final: float
    no_random_start: bool
    craft_training: bool
    no_guard: bool
    epochs: int
    batch_size: int
    optimizer: str
    lr: float
    schedule: str
    momentum: float
    weight_decay: float
    label_smoothing: float
    ema: float
    early_stop: bool
    warmup: float
    boundaries: tuple[float, ...]
    max_grad_norm: float
    grad_accum: int
    mixed_precision: bool
    recompute: str
    convolutions: str
    seed: int
    no_deterministic: bool
    strategy: str
    logical_cpus: int
    val_size: int
    val_steps: int
    eval_attacks: str
    eval_eps: str | None
    eval_limit: int | None
    no_eval: bool
    resolved: dict | None

    @property
    def certified(self) -> bool:
        """Whether the method bounds the model."""

    @property
    def architecture(self) -> str | None:
        """The architecture a new model gets."""

    def settings(self) -> ResolvedSettings:
        """Where each setting came from."""
