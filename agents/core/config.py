"""Configuration dataclasses shared by the agents: documented fields, validated early.

Each field carries a docstring (the string literal under it). ``__post_init__``
validates everything it can before an environment is built, and raises
``ValueError`` naming the offending field. ``to_dict``/``from_dict`` round-trip
through JSON (an env factory is not serialisable: it is saved as ``None`` and must be
passed again to :func:`agents.load`). :func:`make_config` builds a config from a tuned preset
(the table ``presets.json``, read by :mod:`agents.core.presets`, whose names are also found
here) and overrides.

>>> PPOConfig(n_steps=64, n_minibatches=4).to_dict()["n_steps"]
64
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agents.core.plugin import ROBUSTNESS
from agents.core.presets import (  # noqa: F401 - PRESETS_FILE, load_presets: also read here by callers
    AUTO,
    PRESETS_FILE,
    get_preset,
    load_presets,
    preset_for,
)
from agents.envs import check_env_id
from agents.graph_envs import GRAPH_ENV_IDS
from robustgrad.checks import (
    MAX_LEARNING_RATE,
    ArgumentTypeError,
    choice,
    nonnegative,
    number,
    positive_int,
    probability,
)
from robustgrad.errors import ConfigError
from robustgrad.memory import check_allocation

_log = logging.getLogger("agents")

MAX_ITERATIONS_PER_CALL = 4096
"""The largest ``iterations_per_call``: Python's share of a call is already negligible at 32
(one CartPole seed at 0.94x PureJaxRL's steps per CPU second, ``docs/benchmarks/agents.md``), and a
larger ``K`` only moves callbacks, checkpoints and interrupts further apart. ``learn`` never runs
more iterations per call than its budget has (the compiled loop is sized by that)."""

MAX_NUM_ENVS = 65_536
"""The largest ``num_envs``: 16x the widest vectorised batches of the graph-env literature
(PureJaxRL's 4,096 per device); a Python (gymnasium) env per copy costs far more first."""

MAX_ASYNC_ENVS = 1_024
"""The largest ``num_envs`` with ``async_envs=True``: each environment is a subprocess."""

MAX_ROLLOUT_TRANSITIONS = 2**24
"""The most transitions one on-policy rollout holds (``n_steps * num_envs * num_seeds``, kept in
memory with their observations until the update): 16.8 million, 128x the 131,072 of a
PureJaxRL-sized batch (2,048 envs x 64 steps), about 1 GiB for CartPole's four floats."""

MAX_HIDDEN_SIZE = 65_536
"""The widest hidden layer: a 65,536 x 65,536 float32 weight matrix alone is 16 GiB."""

MAX_REPEATS = 100_000
"""The most repetitions of one step per update (``n_epochs``, ``robust_steps``,
``gradient_steps``): each multiplies the time of every update, and none of the published
settings of these methods uses more than a few hundred."""

MAX_UPDATE_WORK = 2**22
"""The most per-transition gradient passes one compiled update makes: PPO's ``n_epochs * n_steps
* num_envs * num_seeds``, DQN's ``gradient_steps * batch_size * num_seeds``, each times ``1 +
robust_steps`` when a robust regulariser searches every minibatch (``robust`` ``"sa"``,
``"atla-sa"``, ``"wocar"`` with ``robust_method`` ``"pgd"``/``"sgld"``). Ctrl-C and SIGTERM reach
Python only between compiled calls, so this bounds the wait for a stop: at the bound
(``n_epochs=8192`` over 512 transitions, the 64x64 network, ``--threads 1``) ``train-agent``
exited 21 s after SIGTERM on a 2-core machine at load 5, where ``n_epochs=100000`` (51 million
passes) took 197 s. The largest published settings stay well inside it
(IsaacGym's humanoid PPO, 4,096 envs x 32 steps x 5 epochs = 655,360; SA-PPO's MuJoCo runs,
2,048 x 10 epochs x 11 = 225,280)."""

MAX_TOTAL_STEPS = 10**10
"""The largest ``learn`` budget (``total_steps``, ``robustgrad train-agent --steps``): about six
CPU days at 18,000 environment steps per CPU second, 50x Atari's 200M-frame benchmark budget."""


def check_total_steps(value: Any, name: str = "total_steps") -> int:
    """``value`` as a learn budget: an int in ``[1, MAX_TOTAL_STEPS]``, or a
    :class:`robustgrad.errors.ConfigError` naming ``name`` (``"--steps"`` on the command line).

    >>> check_total_steps(1e5)
    100000
    >>> check_total_steps(10**15, "--steps")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: --steps must be an int in [1, 10000000000], got 1000000000000000
    """
    return positive_int(value, name, maximum=MAX_TOTAL_STEPS)


EPISODE_SLOT_BYTES = 16
"""Bytes per slot of the graph env's ring buffer of finished episodes (a float32 return and an
int32 length, allocated from zeros of the same size): ``iterations_per_call * n_steps * num_envs
* num_seeds`` slots when ``K > 1`` (:func:`agents.backends.graph_backend.episode_capacity`)."""


def check_update_work(config: Any, work: int, terms: str) -> None:
    """Refuse an update of more than :data:`MAX_UPDATE_WORK` passes (``work``, the product
    ``terms`` names), times ``1 + robust_steps`` when the robust regulariser searches each
    minibatch; a :class:`ConfigError` naming the fields and their values."""
    if config.robust in ("sa", "atla-sa", "wocar") and config.robust_method != "convex":
        work, terms = work * (1 + config.robust_steps), f"{terms} * (1 + robust_steps)"
    if work > MAX_UPDATE_WORK:
        raise ConfigError(f"{terms} must be at most {MAX_UPDATE_WORK} (gradient passes of one "
                          f"update, which a stop request waits for), got {work}")


def _positive(value: Any, name: str) -> float:
    """A finite number > 0 (a learning rate, a clip coefficient)."""
    return number(value, name, minimum=0, min_inclusive=False)


class RobustMethod:
    """A typed robust training config: ``PPO(robust=SA(eps=0.05, kappa=0.5))``.

    It stands for the flat ``robust*`` fields of :class:`AgentConfig` that it sets
    (:meth:`fields`); the config keeps those (``config.robust`` becomes the method's name), so a
    config saves, loads and prints as before and agents saved by earlier versions load. A field
    left ``None`` keeps the config's value (the preset's or the default), so ``SA(eps=0.02)`` on
    a DQN keeps its preset's kappa. ``config.robust_spec`` reads the fields back as one."""

    name: ClassVar[str]
    _FIELDS: ClassVar[dict[str, str]]  # attribute -> config field

    def fields(self) -> dict:
        """The config fields this method sets: ``robust`` and each attribute given."""
        out = {"robust": self.name}
        for attr, field in self._FIELDS.items():
            value = getattr(self, attr)
            if value is not None:
                out[field] = value
        return out


@dataclass(frozen=True)
class SA(RobustMethod):
    """``robust="sa"``: the state-adversarial regulariser (SA-PPO, SA-A2C, SA-DQN;
    :mod:`agents.robustness.robust`). ``eps``: the ball's radius; ``kappa``: the term's weight;
    ``steps``, ``method``: the inner maximiser (``"pgd"``, ``"sgld"``, ``"convex"``);
    ``warmup``: fraction of the budget over which eps and kappa rise from 0.

    >>> PPOConfig(robust=SA(eps=0.05, kappa=0.5)).robust_spec
    SA(eps=0.05, kappa=0.5, steps=10, method='pgd', warmup=0.75)
    """

    eps: float | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    warmup: float | None = None
    name: ClassVar[str] = "sa"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "kappa": "robust_kappa", "steps": "robust_steps",
        "method": "robust_method", "warmup": "robust_eps_warmup"}


@dataclass(frozen=True)
class Adversarial(RobustMethod):
    """``robust="adv"``: train on observations attacked by ``attack`` (``"random"``,
    ``"action"``, ``"mad"``, ``"critic"``) at radius ``eps`` with ``steps`` steps; ``warmup`` as
    :class:`SA`.

    >>> DQNConfig(robust=Adversarial(eps=0.02, attack="mad")).robust
    'adv'
    """

    eps: float | None = None
    attack: str | None = None
    steps: int | None = None
    warmup: float | None = None
    name: ClassVar[str] = "adv"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "attack": "robust_attack", "steps": "robust_steps",
        "warmup": "robust_eps_warmup"}


@dataclass(frozen=True)
class ATLA(RobustMethod):
    """``robust="atla"``: alternate with a learned adversary at radius ``eps``
    (:mod:`agents.robustness.atla`; ``start_radius``: its curriculum, ``warmup`` as :class:`SA`);
    with ``kappa`` also SA's regulariser (``robust="atla-sa"``, ``steps`` and ``method`` its inner
    maximiser).

    >>> PPOConfig(robust=ATLA(eps=0.1, kappa=0.2)).robust
    'atla-sa'
    """

    eps: float | None = None
    warmup: float | None = None
    start_radius: float | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "warmup": "robust_eps_warmup", "start_radius": "atla_start_radius",
        "kappa": "robust_kappa", "steps": "robust_steps", "method": "robust_method"}

    @property
    def name(self) -> str:  # type: ignore[override]
        """``"atla-sa"`` with a ``kappa``, else ``"atla"``."""
        return "atla" if self.kappa is None else "atla-sa"


@dataclass(frozen=True)
class WocaR(RobustMethod):
    """``robust="wocar"``: worst-case-aware robust training (WocaR-PPO, WocaR-A2C, WocaR-DQN; Liang et al.,
    NeurIPS 2022; :mod:`agents.robustness.wocar`). ``eps``: the ball's radius (> 0); ``weight``:
    the worst-attack value's weight in the policy objective; ``bound``: the bound method of the
    admissible actions (``"ibp"`` or ``"crown"``); ``kappa``, ``steps``, ``method``: the
    importance-weighted smoothness term and its inner maximiser (``"pgd"``, ``"sgld"``);
    ``warmup`` as :class:`SA`.

    >>> PPOConfig(robust=WocaR(eps=0.05, weight=0.5)).robust_spec
    WocaR(eps=0.05, weight=0.5, bound=None, kappa=0.1, steps=10, method='pgd', warmup=0.75)
    """

    eps: float | None = None
    weight: float | None = None
    bound: str | None = None
    kappa: float | None = None
    steps: int | None = None
    method: str | None = None
    warmup: float | None = None
    name: ClassVar[str] = "wocar"
    _FIELDS: ClassVar[dict[str, str]] = {
        "eps": "robust_eps", "weight": "wocar_weight", "bound": "wocar_bound",
        "kappa": "robust_kappa", "steps": "robust_steps", "method": "robust_method",
        "warmup": "robust_eps_warmup"}


WOCAR_BOUNDS = ("ibp", "crown")
"""Bound methods of WocaR's admissible actions (``wocar_bound``; :mod:`agents.robustness.wocar`)."""

ROBUST_METHODS: dict[str, type[RobustMethod]] = {"sa": SA, "adv": Adversarial, "atla": ATLA,
                                                 "atla-sa": ATLA, "wocar": WocaR}
"""``robust`` name -> its typed config class."""


@dataclass
class AgentConfig:
    """Fields common to every agent."""

    env: Any = "CartPole-v1"
    """A gymnasium id (``"CartPole-v1"``) or a factory returning a ``gymnasium.Env``."""
    num_envs: int = 1
    """Number of parallel environments in the training ``gymnasium.vector`` env."""
    async_envs: bool = False
    """Step the environments in subprocesses (``AsyncVectorEnv``) instead of a loop."""
    seed: int = 0
    """Seed for the environments, the initial weights and all sampling."""
    gamma: float = 0.99
    """Discount factor."""
    learning_rate: float = 2.5e-4
    """Adam learning rate (Adam's epsilon is 1e-5)."""
    max_grad_norm: float | None = 0.5
    """Clip gradients to this global norm (``None``: no clipping). Non-finite gradients are
    always rejected by the guard."""
    hidden_sizes: tuple = (64, 64)
    """Hidden layer sizes of each network."""
    activation: str = "tanh"
    """Hidden activation: ``"tanh"`` or ``"relu"``."""
    normalize_obs: bool = False
    """Normalise observations with running statistics (inside the model, saved with it)."""
    normalize_reward: bool = False
    """Scale rewards by the running standard deviation of the discounted return."""
    max_nonfinite_updates: int = 5
    """Stop training (``NonFiniteTrainingError``) after this many consecutive updates whose
    every gradient step was rejected as non-finite."""
    checkpoint_dir: str | None = None
    """Directory for periodic checkpoints (and the crash checkpoint of a failing env)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many environment steps (0: only at the end of ``learn``)."""
    jit_compile: bool = False
    """Compile the update step with XLA. Off by default: on a 2-core CPU it made the PPO
    CartPole update ~1.5x faster but costs ~15 s of compilation; measure on your platform."""
    backend: str = "gymnasium"
    """Where the environments run: ``"gymnasium"`` (Python envs, any id or factory) or
    ``"graph"`` (the TensorFlow-ops envs of :mod:`agents.graph_envs`, stepped inside the
    compiled iteration; only for :data:`agents.graph_envs.GRAPH_ENV_IDS`)."""
    preset: str | None = None
    """Name of the tuned preset (``agents/presets.json``) the other fields were taken from
    (``None``: dataclass defaults and overrides only). Recorded, not re-applied on load."""
    robust: str | RobustMethod | None = None
    """Robust training against observation perturbations (:mod:`agents.robustness.robust`): ``None``
    (plain training), ``"sa"`` (state-adversarial regulariser: SA-PPO/SA-A2C's
    ``kappa * max KL(pi(.|s) || pi(.|s_hat))``, SA-DQN's hinge on the greedy action's Q-margin;
    Zhang et al., NeurIPS 2020), ``"adv"`` (train on observations attacked by
    ``robust_attack``) or ``"atla"`` / ``"atla-sa"`` (PPO, A2C: alternate with a learned
    adversary, plus SA's regulariser for ``"atla-sa"``; :mod:`agents.robustness.atla`). REINFORCE has no
    robust variant. A typed config
    (:class:`SA`, :class:`Adversarial`, :class:`ATLA`: ``robust=SA(eps=0.05, kappa=0.5)``) sets
    this field and the ``robust_*`` fields it names (``robust_spec`` reads them back as one)."""
    robust_eps: float = 0.1
    """L-inf radius of the observation ball, in standard deviations when ``normalize_obs``
    (inside the normaliser, as the papers) and in raw units otherwise."""
    robust_kappa: float = 0.1
    """Weight kappa of the SA regulariser (``robust="sa"``). The default is the SA-PPO paper's
    usual value (0.003-1 on MuJoCo, in normalised units); the kappa that works depends on the
    environment and its units, so tuned presets carry their own (``ppo-CartPole-v1``: 3, since
    at raw eps 0.05 kappa 0.1 kept a median 100.5 under attack, 1 kept 254.5 and 3 kept 500;
    docs/benchmarks/robust-rl.md). ``dqn-CartPole-v1`` carries 0.5: SA-DQN trained at eps 0.02
    kept a median of 500 under the strongest attack with 0.5 and 397 with 0.1 (5 seeds)."""
    robust_steps: int = 10
    """Steps of the inner maximisation (step size ``robust_eps / robust_steps``)."""
    robust_method: str = "pgd"
    """Inner maximiser of SA-PPO/SA-A2C's KL (``robust="sa"``): ``"pgd"`` (the ``mad``
    attack), ``"sgld"`` (SA-PPO's stochastic gradient Langevin dynamics,
    :func:`agents.robustness.observation_attacks.sgld_mad_attack`) or ``"convex"`` (no search: CROWN-IBP
    bounds over the ball, :func:`agents.robustness.robust.convex_policy_regularizer`). SA-DQN takes
    ``"pgd"`` or ``"convex"``."""
    robust_eps_warmup: float = 0.75
    """Fraction of the ``learn`` budget over which eps and kappa rise linearly from 0 to
    ``robust_eps`` and ``robust_kappa`` (0: full strength from the first update)."""
    atla_start_radius: float | None = None
    """ATLA's adversary radius curriculum (``robust="atla"`` / ``"atla-sa"``; :mod:`agents.robustness.atla`):
    ``None`` trains the adversary at the agent's radius (the schedule's eps, rising from 0); a
    radius >= ``robust_eps`` (same units) trains it at a radius shrinking linearly from this one
    to ``robust_eps`` over ``robust_eps_warmup`` of the budget, while the agent meets its
    perturbations at the schedule's eps (:func:`agents.robustness.atla.adversary_radius`)."""
    robust_attack: str = "action"
    """The attack of ``robust="adv"`` (``"random"``, ``"action"``, ``"mad"`` or ``"critic"``;
    see :mod:`agents.robustness.observation_attacks`). The default, PGD away from the greedy action, is the
    attack of the adversarial-training baselines (Kos & Song 2017, Pattanaik et al. 2018); on
    CartPole it did better than ``"mad"``, which at 100k steps kept a median of 128.5 / 170
    under Robust Sarsa at eps 0.05 against ``"action"``'s 295.5 / 246.5 (seeds 3 / 0); at 200k
    steps ``"action"`` kept a median of 386.5 under the strongest attack at eps 0.05 over 5
    seeds, vanilla PPO 38 (docs/benchmarks/robust-rl.md)."""

    wocar_weight: float | None = None
    """WocaR's weight of the worst-attack value in the policy objective (``robust="wocar"``;
    :mod:`agents.robustness.wocar`), rising linearly to this value over ``robust_eps_warmup``
    of the budget. PPO/A2C: the update optimises ``n(A) + w * n(Q_w(s, a))`` (each
    standardised over the batch; ``None``: :data:`agents.robustness.wocar.WEIGHT`). DQN (in
    [0, 1]): the TD target's next action is ``argmax_a (1 - w) Q(s', a) + w Q_w(s', a)``
    (``None``: :data:`agents.robustness.wocar.DQN_WEIGHT`)."""
    wocar_bound: str | None = None
    """The bound method of WocaR's admissible actions (``"ibp"`` or ``"crown"``; costs in
    :mod:`agents.robustness.wocar`). ``None``: ``"ibp"``."""

    def __post_init__(self):
        check_env_id(self.env, "env")
        self.num_envs = positive_int(self.num_envs, "num_envs", maximum=MAX_NUM_ENVS)
        if self.async_envs and self.num_envs > MAX_ASYNC_ENVS:
            raise ConfigError(f"num_envs must be an int in [1, {MAX_ASYNC_ENVS}] with "
                              f"async_envs=True (one subprocess per environment), got "
                              f"{self.num_envs}")
        number(self.learning_rate, "learning_rate", minimum=0, min_inclusive=False,
               maximum=MAX_LEARNING_RATE)
        probability(self.gamma, "gamma")
        if self.max_grad_norm is not None:
            _positive(self.max_grad_norm, "max_grad_norm")
        if isinstance(self.hidden_sizes, (str, bytes)) or not hasattr(self.hidden_sizes,
                                                                      "__iter__"):
            raise ConfigError(f"hidden_sizes must be a sequence of ints >= 1, got "
                             f"{self.hidden_sizes!r}")
        self.hidden_sizes = tuple(positive_int(h, "hidden_sizes", maximum=MAX_HIDDEN_SIZE)
                                  for h in self.hidden_sizes)
        choice(self.activation, "activation", ("tanh", "relu"))
        self.max_nonfinite_updates = positive_int(self.max_nonfinite_updates,
                                                  "max_nonfinite_updates")
        self.checkpoint_every = positive_int(self.checkpoint_every, "checkpoint_every",
                                             minimum=0, maximum=MAX_TOTAL_STEPS)
        self.seed = positive_int(self.seed, "seed", minimum=0)  # NumPy refuses negative seeds
        choice(self.backend, "backend", ("gymnasium", "graph"))
        if self.backend == "graph":
            if self.env not in GRAPH_ENV_IDS:
                raise ConfigError(f"backend='graph' needs env to be one of {GRAPH_ENV_IDS} "
                                 f"(the compiled environments), got {self.env!r}")
            if self.async_envs:
                raise ConfigError("async_envs: the graph backend steps its environments inside "
                                 "the compiled iteration, not in subprocesses; async_envs=True "
                                 "is for backend='gymnasium'")
        if self.preset is not None and not isinstance(self.preset, str):
            raise ConfigError(f"preset must be a preset name or None, got {self.preset!r}")
        if isinstance(self.robust, RobustMethod):  # a typed config: the flat fields it names
            for name, value in self.robust.fields().items():
                setattr(self, name, value)
        if self.robust is not None:  # the methods the robustness wing registered
            choice(self.robust, "robust", tuple(ROBUSTNESS) or ("sa", "adv", "atla", "atla-sa"))
        nonnegative(self.robust_eps, "robust_eps")
        nonnegative(self.robust_kappa, "robust_kappa")
        self.robust_steps = positive_int(self.robust_steps, "robust_steps", maximum=MAX_REPEATS)
        choice(self.robust_method, "robust_method", ("pgd", "sgld", "convex"))
        probability(self.robust_eps_warmup, "robust_eps_warmup")
        if self.atla_start_radius is not None:
            if self.robust not in ("atla", "atla-sa"):
                raise ConfigError(f"atla_start_radius: only with robust='atla' or 'atla-sa' (the "
                                 f"learned adversary's curriculum), got robust={self.robust!r}")
            self.atla_start_radius = number(self.atla_start_radius, "atla_start_radius",
                                            minimum=self.robust_eps)
        choice(self.robust_attack, "robust_attack", ("random", "action", "mad", "critic"))
        self._check_wocar()

    _WOCAR_SEARCHES: ClassVar[tuple[str, ...]] = ("pgd", "sgld")
    """The inner maximisers WocaR's smoothness term can use with this algorithm."""

    def _check_wocar(self) -> None:
        """WocaR's settings: only with ``robust="wocar"``, eps > 0, a search inner maximiser."""
        for name in ("wocar_weight", "wocar_bound"):
            if getattr(self, name) is not None and self.robust != "wocar":
                raise ConfigError(f"{name}: a WocaR setting, only with robust='wocar' (WocaR "
                                  f"combines with no other robust method), got robust="
                                  f"{self.robust!r}")
        if self.robust != "wocar":
            return
        number(self.robust_eps, "robust_eps", minimum=0, min_inclusive=False)
        if self.wocar_weight is not None:
            self.wocar_weight = number(self.wocar_weight, "wocar_weight", minimum=0)
        if self.wocar_bound is not None:
            choice(self.wocar_bound, "wocar_bound", WOCAR_BOUNDS)
        if self.robust_method not in self._WOCAR_SEARCHES:
            raise ConfigError(f"robust_method: WocaR weights the KL at a searched s_hat by the "
                              f"state's importance; {' or '.join(map(repr, self._WOCAR_SEARCHES))}"
                              f", got {self.robust_method!r}")

    @property
    def robust_spec(self) -> RobustMethod | None:
        """The robust training fields as one typed config (:class:`SA`, :class:`Adversarial`,
        :class:`ATLA`, :class:`WocaR`), or ``None`` (``robust=None``, or a method without a typed config)."""
        cls = ROBUST_METHODS.get(self.robust) if isinstance(self.robust, str) else None
        if cls is None:  # robust=None, or a method registered without a typed config
            return None
        values = {attr: getattr(self, field) for attr, field in cls._FIELDS.items()}
        if self.robust == "atla":
            values.update(kappa=None, steps=None, method=None)
        return cls(**values)

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (an env factory becomes ``None``)."""
        d = dataclasses.asdict(self)
        if callable(self.env):
            d["env"] = None
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict, env: Any = None) -> AgentConfig:
        """The config saved by :meth:`to_dict` (unknown keys ignored; ``env`` replaces a saved
        factory)."""
        d = dict(d)
        if env is not None:
            d["env"] = env
        if d.get("env") is None:
            raise ConfigError("env: the saved agent was trained on an env factory; pass env=")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class OnPolicyConfig(AgentConfig):
    """Fields of the on-policy actor-critic agents (REINFORCE, A2C, PPO)."""

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 128
    """Steps per environment in each rollout (batch = ``num_envs * n_steps``)."""
    gae_lambda: float = 0.95
    """GAE lambda (1.0: Monte-Carlo returns minus the baseline)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the ``learn`` call."""
    normalize_advantages: bool = True
    """Standardise advantages (per minibatch for PPO, per batch otherwise)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""
    num_seeds: int = 1
    """Train this many seeds at once (``seed, seed + 1, ...``) as one agent whose tensors carry a
    leading seed axis (:mod:`agents.algorithms.onpolicy`); ``agent.export(s)`` gives seed ``s`` as an
    ordinary agent. Robust training works on the axis: ``"sa"`` and ``"adv"`` (each seed attacked
    against its own policy, :mod:`agents.robustness.robust`), ``"atla"`` and ``"atla-sa"`` (each seed
    against its own learned adversary, :mod:`agents.robustness.atla`); not a custom ``transform``."""
    iterations_per_call: int = 1
    """Iterations (rollout + targets + update) per compiled call on ``backend="graph"``: a
    ``tf.while_loop`` inside the one call (XLA too with ``jit_compile``), so Python runs once per
    ``iterations_per_call`` iterations. Bit-identical to 1 (weights, optimiser state, history);
    what changes is when Python sees the agent: callbacks, checkpoints and interrupts act at call
    boundaries (:meth:`agents.Agent.learn`; :mod:`agents.algorithms.onpolicy`). 1 (the default) keeps a
    callback per iteration; the gymnasium backend and robust training need 1."""

    def __post_init__(self):
        super().__post_init__()
        self.num_seeds = positive_int(self.num_seeds, "num_seeds")
        self.iterations_per_call = positive_int(self.iterations_per_call, "iterations_per_call")
        if self.iterations_per_call > MAX_ITERATIONS_PER_CALL:
            raise ConfigError(f"iterations_per_call must be at most {MAX_ITERATIONS_PER_CALL} "
                              f"(Python's share of a call is already negligible at 32), got "
                              f"{self.iterations_per_call}")
        if self.iterations_per_call > 1 and self.backend != "graph":
            raise ConfigError(f"iterations_per_call: several iterations per compiled call need "
                             f"backend='graph' (the environments inside the call); got "
                             f"iterations_per_call={self.iterations_per_call} with backend="
                             f"{self.backend!r}")
        if self.iterations_per_call > 1 and self.robust is not None:
            raise ConfigError(f"iterations_per_call: robust training ({self.robust!r}) updates its "
                             f"eps/kappa schedule (and ATLA its adversary) in Python between "
                             f"iterations; use iterations_per_call=1, got "
                             f"{self.iterations_per_call}")
        self.n_steps = positive_int(self.n_steps, "n_steps", maximum=MAX_ROLLOUT_TRANSITIONS)
        rollout = self.n_steps * self.num_envs * self.num_seeds
        if rollout > MAX_ROLLOUT_TRANSITIONS:
            raise ConfigError(f"n_steps * num_envs * num_seeds must be at most "
                              f"{MAX_ROLLOUT_TRANSITIONS} (transitions one rollout keeps in "
                              f"memory), got {self.n_steps} * {self.num_envs} * "
                              f"{self.num_seeds} = {rollout}")
        if self.iterations_per_call > 1:  # the graph env's ring buffer of finished episodes
            try:
                check_allocation(self.iterations_per_call,
                                 EPISODE_SLOT_BYTES * self.n_steps * self.num_envs * self.num_seeds,
                                 argument="iterations_per_call",
                                 what=f"the record of the episodes one call can finish ("
                                      f"{self.n_steps} steps x {self.num_envs * self.num_seeds} "
                                      f"envs per iteration)")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        probability(self.gae_lambda, "gae_lambda")
        nonnegative(self.ent_coef, "ent_coef")
        nonnegative(self.vf_coef, "vf_coef")
        number(self.log_std_init, "log_std_init")


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO (Schulman et al. 2017) with the CleanRL ``ppo.py`` defaults for CartPole.

    Implementation details (Huang et al. 2022) that apply to vector observations: vector
    envs, orthogonal init, Adam eps 1e-5, LR annealing, GAE, minibatch epochs, advantage
    normalisation, clipped surrogate, value clipping, entropy bonus, global gradient
    clipping, separate networks, truncation bootstrapping, target-KL early stop.
    """

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 128
    """Steps per environment in each rollout."""
    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    n_epochs: int = 4
    """Optimisation epochs over each rollout (``update_epochs`` in CleanRL)."""
    n_minibatches: int = 4
    """Minibatches per epoch."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient epsilon."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimate (same coefficient)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    target_kl: float | None = None
    """Stop the epochs of an update early once the approximate KL exceeds this."""

    def __post_init__(self):
        super().__post_init__()
        self.n_epochs = positive_int(self.n_epochs, "n_epochs", maximum=MAX_REPEATS)
        self.n_minibatches = positive_int(self.n_minibatches, "n_minibatches")
        _positive(self.clip_coef, "clip_coef")
        if self.target_kl is not None:
            _positive(self.target_kl, "target_kl")
        if (self.num_envs * self.n_steps) % self.n_minibatches:
            raise ConfigError(
                f"n_minibatches must divide num_envs * n_steps = {self.num_envs * self.n_steps},"
                f" got {self.n_minibatches}")
        check_update_work(self, self.n_epochs * self.n_steps * self.num_envs * self.num_seeds,
                          "n_epochs * n_steps * num_envs * num_seeds")


@dataclass
class A2CConfig(OnPolicyConfig):
    """Synchronous advantage actor-critic (Mnih et al. 2016): short n-step rollouts, one
    gradient step each. Defaults follow Stable-Baselines3's A2C (with Adam)."""

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 5
    """Steps per environment in each rollout."""
    gae_lambda: float = 1.0
    """GAE lambda (1.0: plain n-step returns)."""
    learning_rate: float = 7e-4
    """Adam learning rate."""
    normalize_advantages: bool = False
    """Standardise advantages over the batch."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""


@dataclass
class REINFORCEConfig(OnPolicyConfig):
    """REINFORCE (Williams 1992) with a learned state-value baseline.

    Returns are Monte-Carlo returns-to-go, independent of the value estimates; only the
    end of a rollout that cuts an episode (and a time-limit truncation) bootstraps from
    the baseline. Use long rollouts (``n_steps`` near the episode length).
    """

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 256
    """Steps per environment in each rollout."""
    learning_rate: float = 1e-3
    """Adam learning rate (policy and baseline)."""
    gae_lambda: float = 1.0
    """Fixed at 1 (Monte-Carlo returns)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def __post_init__(self):
        super().__post_init__()
        if self.gae_lambda != 1.0:
            raise ConfigError(f"gae_lambda must be 1.0 for REINFORCE (Monte-Carlo returns), got "
                             f"{self.gae_lambda!r}")
        if self.robust is not None:
            raise ConfigError(f"robust: REINFORCE has no robust variant (use PPO, A2C or DQN), "
                             f"got {self.robust!r}")


@dataclass
class DQNConfig(AgentConfig):
    """DQN (Mnih et al. 2015) with Double DQN (van Hasselt et al. 2016), Huber loss, a
    uniform replay buffer, a linear epsilon-greedy schedule and hard or Polyak target
    updates. Defaults follow the rl-baselines3-zoo CartPole-v1 settings, with epsilon decayed
    over the zoo's 8k steps of a 100k budget and the learning rate decayed linearly to 0."""

    num_envs: int = 1
    """Number of parallel environments."""
    learning_rate: float = 2.3e-3
    """Adam learning rate."""
    learning_rate_final: float | None = 0.0
    """The learning rate decays linearly from ``learning_rate`` to this value over the
    ``learn`` budget (``None``: constant, as in the zoo). On CartPole-v1 at 100k steps the decay
    took the final greedy policy to >= 475 in 4 of 5 seeds, against 1 of 5 with a constant rate
    (``benchmarks/agents.py`` rows ``dqn-cartpole-lr-decay`` and ``dqn-cartpole``)."""
    max_grad_norm: float | None = 10.0
    """Global-norm gradient clipping."""
    hidden_sizes: tuple = (256, 256)
    """Hidden layer sizes of the Q-network."""
    activation: str = "relu"
    """Hidden activation."""
    buffer_size: int = 100_000
    """Replay buffer capacity in transitions."""
    batch_size: int = 64
    """Minibatch size of each gradient step."""
    learning_starts: int = 1000
    """Environment steps of random actions before learning starts."""
    train_freq: int = 256
    """Environment steps (per env) between training phases."""
    gradient_steps: int = 128
    """Gradient steps in each training phase."""
    target_update_interval: int = 10
    """Environment steps between target-network updates (SB3/CleanRL convention)."""
    tau: float = 1.0
    """Target update rate: 1.0 is a hard copy, < 1 is Polyak averaging."""
    double_dqn: bool = True
    """Select the next action with the online network, evaluate it with the target one."""
    huber_delta: float = 1.0
    """Huber loss threshold (smooth L1)."""
    prioritized_replay: bool = False
    """Proportional prioritised experience replay (Schaul et al. 2016): transitions are
    sampled with probability proportional to ``(|TD error| + priority_eps) ** priority_alpha``
    (new ones at the highest priority so far) and the loss is weighted by importance-sampling
    weights ``(N P(i)) ** -beta`` (divided by the batch maximum)."""
    priority_alpha: float = 0.6
    """How strongly priorities shape sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Initial importance-sampling exponent, annealed linearly to 1 over the ``learn`` budget."""
    priority_eps: float = 1e-6
    """Added to ``|TD error|`` so that no transition gets priority 0."""
    exploration_fraction: float = 0.08
    """Fraction of the ``learn`` budget over which epsilon decays linearly (0.08: the zoo's 8k
    steps for a 100k budget; the zoo's 0.16 is for its 50k)."""
    exploration_initial_eps: float = 1.0
    """Initial epsilon."""
    exploration_final_eps: float = 0.04
    """Final epsilon."""
    eval_epsilon: float = 0.0
    """Epsilon of ``act(deterministic=False)`` outside training."""
    _WOCAR_SEARCHES: ClassVar[tuple[str, ...]] = ("pgd",)  # SA-DQN's margin: PGD (no SGLD)
    num_seeds: int = 1
    """Train this many seeds at once (``seed, seed + 1, ...``) as one agent whose networks,
    optimiser, observation statistics and replay buffer carry a leading seed axis
    (:mod:`agents.algorithms.dqn`); ``agent.export(s)`` gives seed ``s`` as an ordinary agent. SA-DQN and
    adversarial training (``robust="sa"``, ``"adv"``) work on the axis (each seed attacked against
    its own Q-network, :mod:`agents.robustness.robust`); not a custom ``transform``."""

    def __post_init__(self):
        super().__post_init__()
        self.num_seeds = positive_int(self.num_seeds, "num_seeds")
        if self.robust in ("atla", "atla-sa"):
            raise ConfigError(f"robust: ATLA trains an actor-critic (PPO, A2C) against a learned "
                             f"adversary; DQN supports 'sa', 'adv' and 'wocar', got "
                             f"{self.robust!r}")
        if self.robust == "wocar" and self.wocar_weight is not None:  # a mixing weight here
            probability(self.wocar_weight, "wocar_weight")
        if self.robust is not None and self.robust_method not in ("pgd", "convex"):
            raise ConfigError(f"robust_method: SA-DQN bounds the greedy action's margin by PGD or "
                             f"by the convex relaxation; 'pgd' or 'convex', got "
                             f"{self.robust_method!r}")
        for name in ("buffer_size", "batch_size"):
            setattr(self, name, positive_int(getattr(self, name), name))
        self.train_freq = positive_int(self.train_freq, "train_freq",
                                       maximum=MAX_ROLLOUT_TRANSITIONS)
        collected = self.train_freq * self.num_envs * self.num_seeds
        if collected > MAX_ROLLOUT_TRANSITIONS:  # one training phase's steps, collected at once
            raise ConfigError(f"train_freq * num_envs * num_seeds must be at most "
                              f"{MAX_ROLLOUT_TRANSITIONS} (transitions one collection keeps in "
                              f"memory), got {self.train_freq} * {self.num_envs} * "
                              f"{self.num_seeds} = {collected}")
        for name in ("target_update_interval", "learning_starts"):  # periods in env steps
            setattr(self, name, positive_int(getattr(self, name), name,
                                             minimum=0 if name == "learning_starts" else 1,
                                             maximum=MAX_TOTAL_STEPS))
        self.gradient_steps = positive_int(self.gradient_steps, "gradient_steps",
                                           maximum=MAX_REPEATS)
        if self.learning_rate_final is not None:
            nonnegative(self.learning_rate_final, "learning_rate_final")
        probability(self.tau, "tau", open_low=True)
        _positive(self.huber_delta, "huber_delta")
        for name in ("priority_alpha", "priority_beta", "exploration_fraction",
                     "exploration_initial_eps", "exploration_final_eps", "eval_epsilon"):
            probability(getattr(self, name), name)
        _positive(self.priority_eps, "priority_eps")
        if self.batch_size > self.buffer_size:
            raise ConfigError(f"batch_size must be <= buffer_size ({self.buffer_size}), got "
                             f"{self.batch_size}")
        check_update_work(self, self.gradient_steps * self.batch_size * self.num_seeds,
                          "gradient_steps * batch_size * num_seeds")


def make_config(config_cls: type[AgentConfig], algo: str, preset: str | None = AUTO,
                **overrides: Any) -> AgentConfig:
    """A ``config_cls`` built from a preset and ``overrides`` (which win over the preset).

    ``preset``: :data:`AUTO` (the preset for ``algo`` on ``overrides["env"]``, or on the
    default env, when one exists; :mod:`agents.core.presets`), a preset name, or
    ``None``/``"none"`` (dataclass defaults only). The config records the preset name in
    ``preset``. Unknown fields raise ``ValueError`` naming them.

    >>> make_config(PPOConfig, "ppo", env="CartPole-v1", seed=3).preset
    'ppo-CartPole-v1'
    >>> make_config(PPOConfig, "ppo", preset=None, env="CartPole-v1").n_steps
    128
    >>> make_config(PPOConfig, "ppo", env="CartPole-v1", n_steps=64).n_steps
    64
    """
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"{unknown[0]} is not a field of {config_cls.__name__}; fields: "
                         f"{', '.join(sorted(fields))}")
    if "preset" in overrides:
        raise ConfigError("preset is chosen with the preset= argument, not as an override")
    env = overrides.get("env", config_cls.env)
    if preset == AUTO:
        name = preset_for(algo, env)
    elif preset is None or (isinstance(preset, str) and preset.lower() == "none"):
        name = None
    else:
        name = preset
    values = {}
    if name is not None:
        values.update(get_preset(name, algo)["config"])
        bad = sorted(set(values) - fields)
        if bad:  # a broken presets.json
            raise ConfigError(f"preset {name!r}: {bad[0]} is not a field of "
                             f"{config_cls.__name__}")
        _log.info("%s: using preset %r (%s)", config_cls.__name__, name,
                  ", ".join(f"{k}={v!r}" for k, v in values.items()))
    values.update(overrides)
    return config_cls(**values, preset=name)


def check_seeds(seeds: Sequence[int] | None = None, num_seeds: int | None = None,
                first_seed: int = 0) -> list[int]:
    """The list of seeds from ``seeds`` (distinct ints >= 0) or ``num_seeds`` (an int >= 1:
    ``first_seed, first_seed + 1, ...``); exactly one of the two.

    >>> check_seeds(num_seeds=3, first_seed=4)
    [4, 5, 6]
    >>> check_seeds(num_seeds=0)
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: num_seeds must be an int >= 1, got 0
    """
    if (seeds is None) == (num_seeds is None):
        raise ConfigError("give exactly one of seeds (a list of ints) and num_seeds (an int)")
    if num_seeds is not None:
        n = positive_int(num_seeds, "num_seeds")
        return [first_seed + i for i in range(n)]
    if seeds is None or isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ArgumentTypeError(f"seeds must be a list of ints >= 0, got {seeds!r}")
    out = [positive_int(s, "seeds", minimum=0) for s in seeds]
    if not out:
        raise ConfigError("seeds must hold at least one seed, got []")
    if len(set(out)) != len(out):
        raise ConfigError(f"seeds must be distinct, got {out}")
    return out
