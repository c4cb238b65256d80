"""WocaR: worst-case-aware robust training without an attacker (``robust="wocar"``).

Liang, Sun, Zheng, Huang, "Efficient Adversarial Training without Attacking: Worst-Case-Aware
Robust Reinforcement Learning", NeurIPS 2022. Instead of training against an attack (SA's inner
search on every update, ATLA's learned adversary), the agent learns what the *worst* attack
within eps would cost it, and optimises for that too. Three pieces, all on the agent's own
rollout (PPO and A2C with a discrete policy; :class:`WocaRPlugin`; with a Gaussian policy on
Box actions, :class:`WocaRBoxPlugin`, the admissible set a box of the mean's bounds,
:mod:`agents.robustness.wocar_box`; DQN's variant, on the replay, is :class:`WocaRDQNPlugin`):

1. **The admissible actions** ``A_adv(s)`` an attacker can induce at ``s``: the actions that can
   be greedy somewhere in the ball ``s ± eps · scale``. Action ``a`` is kept unless some
   ``j`` provably beats it on the whole ball (``ub(z_a − z_j) < 0``), the logit differences
   bounded by :mod:`robustgrad.bounds` over the policy network
   (:func:`agents.robustness.certify.difference_upper_bounds`: each difference merged into the
   last layer) -- :func:`admissible_actions`. A sound over-approximation: every action greedy at
   some ``s_hat`` in the ball is in the set (the tests sample the ball), so the minimum below
   can only be lower than the true worst attack's. The bound method is ``wocar_bound``:

   * ``"ibp"`` (the default): interval propagation, one forward pass of a box per layer, about
     two forward passes of the network per state; the ``A²`` difference rows cost one extra
     ``[A², width]`` product at the last layer only. Looser: more actions are admitted.
   * ``"crown"``: a backward pass of linear bounds through every layer for each of the ``A²``
     specification rows (plus IBP for the intermediate layers' boxes): ``O(A² · Σ width_k ·
     width_{k+1})`` per state, about ``A²`` times IBP's cost for a 2-layer MLP (``A = 2`` on
     CartPole: ~4x), tighter sets.
   * ``"crown-ibp"``: CROWN's backward pass for the ``A²`` difference rows through every layer,
     the relaxations' input bounds taken from IBP (no backward pass per hidden layer): between
     the two in cost and tightness. On CartPole's 64-64 tanh policy, 256 states, one thread
     (2026-12-05, docs/benchmarks/robust-rl.md): IBP ~0.75 ms, CROWN-IBP ~7-10 ms (most of
     it the tanh relaxations, their tangent points bisected from a table's bracket), CROWN
     ~36-41 ms.

2. **The worst-attack critic** ``Q_w(s, a)``, trained by the worst-attack Bellman operator
   ``Q_w(s, a) <- r + gamma · (1 − terminated) · min_{a' in A_adv(s')} Q_w^-(s', a')``
   (:func:`worst_attack_target`; ``Q_w^-`` a Polyak-averaged target network; the target under
   ``tf.stop_gradient``; ``gamma`` the agent's unless ``wocar_gamma`` sets the critic's own,
   a longer horizon than the policy's advantages): an MLP ``[d] -> [A]`` on the agent's
   normalised observations, fitted on each rollout's transitions for ``q_epochs`` epochs of
   ``q_minibatches`` minibatches (squared error, Adam at ``q_lr``, target rate ``tau``;
   defaults 4, 4, 1e-3, 0.01; the paper's PPO code: 10 epochs of 32 minibatches, lr 4e-4, tau
   0.001 on 2048-step MuJoCo rollouts).

3. **The worst-case-aware policy objective and the importance-weighted regulariser**: the update
   optimises ``n(A) + w · n(Q_w^-(s, a))`` instead of the GAE advantages ``A`` (``n``:
   standardised over the rollout; the surrogate is linear in the advantage, so PPO's clipped
   surrogate of this sum is the paper's ``ratio · (A + w · Q_w)``), ``w`` rising linearly to
   ``weight`` (default 0.8, the paper's MuJoCo ``q_weight``) over ``warmup`` of the budget
   (``weight_over_run``: over the whole run, the paper's ``linear`` schedule); plus
   ``kappa · mean_s ω(s) · KL(pi(.|s) || pi(.|s_hat))`` with ``s_hat`` from the ``mad`` attack
   (``robust_method`` ``"pgd"`` or ``"sgld"``, ``robust_steps`` steps, as SA) and ``ω(s)`` the
   state's importance, the spread ``max_a Q_w(s, a) − min_a Q_w(s, a)`` of the worst-attack
   values normalised to mean 1 over the batch (:func:`state_importance`): smoothness is asked
   most where the choice of action matters most. ``s_hat``, ``ω`` and the clean side of the KL
   are computed once per rollout, on all of its states (:meth:`WocaRPlugin.
   rollout_regularizer_inputs`); every update step differentiates ``pi(.|s_hat)`` through the
   current weights (SA-PPO and the paper's code search again on every minibatch of every epoch:
   with the CartPole preset's 20 epochs that search was ~70% of WocaR's training CPU).

The cost (CartPole preset, 100k steps, tracing included, 2026-12-04 on the shared 2-core
machine, docs/benchmarks/robust-rl.md): 1.46x vanilla PPO's training CPU (one seed; 1.64x the
median of 3 seeds at load ~2.6) with the search once per rollout, 2.77x with the search per
minibatch; per rollout of 256 steps the worst-attack critic's 16 steps
cost ~8.5 ms, the admissible sets (IBP, 256 states) ~0.9 ms, one 10-step search ~5.4 ms, against
~2 ms for one PPO gradient step.

Every setting is a field of the typed config :class:`agents.WocaR` (flat ``wocar_*`` fields of
the agent's config, checked with the others; ``None`` takes :attr:`agents.WocaR.DEFAULTS`):
where the paper's PPO code differs from the defaults here, it is one of them
(``admissible_eps``, ``importance``, ``weight_over_run``, ``search_per_rollout``, the critic's
``q_epochs``, ``q_minibatches``, ``q_lr``, ``tau``; screened against Robust Sarsa on CartPole in
docs/benchmarks/robust-rl.md).

eps, kappa and the weight rise from 0 over WocaR's own ``warmup`` (``wocar_warmup``, default 0.3:
the CartPole screen's median worst case 160.5 -> 223 over 3 seeds against SA's 0.75; an agent
saved before the field existed loads with the ``robust_eps_warmup`` it trained with;
:class:`agents.robustness.robust.RobustSchedule`); the admissible sets follow the schedule's eps.
Box actions without finite bounds are refused with a :class:`robustgrad.errors.ConfigError`
naming the argument. The worst-attack networks and
their optimiser are part of the agent's checkpoint (``robustness/``): a loaded ``robust="wocar"``
agent that learns again goes on with its critic (one saved before 2026-12-04 loads without it and
starts a fresh one).

The seed axis (``num_seeds = S > 1``; PPO, A2C on both action kinds, and DQN; DESIGN.md sections
7-8): one code path, each tensor with a leading ``[S]``. The worst-attack networks hold ``S``
stacked copies (copy ``s`` the network seed ``s`` builds alone; one seed keeps an ordinary
agent's shapes, so saved agents load), stepped by the per-seed Adam; the admissible sets of all
seeds are one bound call on the block-diagonal network of the ``S`` policies
(:mod:`agents.robustness.certify`; the block-diagonal matrices are dense, so one call does
``S²`` times one seed's multiply-adds where ``S`` calls would do ``S`` times); the critic's
losses, the objective's standardisation, the importance and the regulariser are each seed's
over its own rows; each seed's random draws come from its own stream as alone, except the
smoothness term's search, one engine call for all seeds whose random start is seed 0's draw
(as SA's on the axis). ``agent.export(s)`` carries
seed ``s``'s worst-attack networks and Adam state
(:meth:`_WorstCaseWeighted.seed_axis_state`); ``train-agent --robust wocar --seeds 0-4`` trains
the seeds in one program and saves each as an ordinary agent.

>>> import tensorflow as tf
>>> q_next = tf.constant([[1.0, 3.0, 2.0]])
>>> allowed = tf.constant([[False, True, True]])   # the attacker can induce actions 1 and 2
>>> float(worst_attack_target(q_next, allowed, tf.constant([1.0]), tf.constant([False]), 0.5)[0])
2.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents.core._step import make_seed_axis_step, step_on_axis
from agents.core.networks import MLP, layer_seed
from agents.core.plugin import RobustnessPlugin, register_robustness
from agents.core.schedules import linear
from agents.core.streams import stateless_per_seed
from agents.robustness._victim import _surface
from agents.robustness.certify import (
    difference_upper_bounds,
    greedy_margin_lower_bounds,
    output_bounds,
)
from agents.robustness.configs import WocaR as WocaRConfig
from agents.robustness.configs import WocaRSettings
from agents.robustness.robust import ScheduledPlugin, certified_margin_hinge, sa_observations
from agents.robustness.wocar_box import (
    action_to_unit,
    admissible_box,
    q_spread_in_box,
    worst_action_in_box,
)
from robustgrad.bounds import affine_stack_bounds
from robustgrad.errors import ConfigError

if TYPE_CHECKING:
    from agents.algorithms.dqn_config import DQNConfig
    from agents.core.base import Agent
    from agents.core.policy import PolicySurface

__all__ = ["WocaRBoxPlugin", "WocaRDQNPlugin", "WocaRPlugin", "admissible_actions",
           "check_wocar_agent", "q_scale", "state_importance", "worst_attack_target", "worst_case_bound_loss"]

_plain = tf.autograph.experimental.do_not_convert
tfd = tfp.distributions

def admissible_actions(surface: PolicySurface, obs: tf.Tensor, eps: float | tf.Tensor,
                       method: str = "ibp") -> tf.Tensor:
    """Which actions an attacker within ``eps`` can make greedy at each of ``obs [B, d]``:
    ``[B, A]`` bool, under ``tf.stop_gradient``. ``a`` is admissible unless some ``j`` has
    ``ub(z_a − z_j) < 0`` over the ball ``obs ± eps · scale`` (logits ``z`` of ``surface``, a
    discrete policy's :class:`agents.PolicySurface`; ``method`` ``"ibp"``, ``"crown"`` or
    ``"crown-ibp"``). The clean greedy action is always in the set. Unchecked (runs inside the
    compiled update).

    >>> import agents
    >>> agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None)
    >>> obs = tf.constant([[0.1, -0.2, 0.3, 0.5]])
    >>> int(admissible_actions(agent.policy_surface(), obs, 0.0).numpy().sum())  # eps 0: greedy
    1
    >>> admissible_actions(agent.policy_surface(), obs, 100.0).numpy().tolist()
    [[True, True]]
    """
    obs = tf.stop_gradient(tf.convert_to_tensor(obs, tf.float32))
    ub = difference_upper_bounds(surface, obs, eps, method)  # [B, A, A]: ub(z_j - z_a) at [a, j]
    reach = tf.reduce_all(tf.linalg.matrix_transpose(ub) >= 0.0, axis=-1)  # all_j ub(z_a - z_j)
    logits = surface.outputs(obs)
    greedy = tf.one_hot(tf.argmax(logits, axis=-1), tf.shape(logits)[-1]) > 0.5
    return tf.stop_gradient(reach | greedy)


def worst_attack_target(q_next: tf.Tensor, admissible: tf.Tensor, rewards: tf.Tensor,
                        terminated: tf.Tensor, gamma: float,
                        q_select: tf.Tensor | None = None) -> tf.Tensor:
    """The worst-attack Bellman target ``r + gamma · (1 − terminated) · q_next(a*)`` per row,
    ``[B]`` float32 under ``tf.stop_gradient``, ``a* = argmin_{a' admissible} q_select(a')``
    (``q_select=None``: ``q_next`` itself, so the term is ``min_{a' admissible} q_next(a')``).

    ``q_next [B, A]``: the (target) worst-attack values at the next state; ``admissible [B, A]``
    bool (:func:`admissible_actions` at the next state; at least one per row); ``rewards [B]``;
    ``terminated [B]`` bool (a truncated episode still bootstraps); ``q_select [B, A]``: the
    values that choose the worst action (the paper's code: the online critic's, the target
    network valuing it, as Double DQN decouples the choice from the value: the min of one
    noisy estimate is biased low as its max is biased high).

    >>> q = tf.constant([[1.0, 3.0, 2.0], [5.0, 0.0, 4.0]])
    >>> adm = tf.constant([[False, True, True], [True, False, False]])
    >>> worst_attack_target(q, adm, tf.constant([1.0, 2.0]), tf.constant([False, True]), 0.5
    ...                     ).numpy().tolist()
    [2.0, 2.0]
    >>> online = tf.constant([[0.0, 1.0, 9.0], [0.0, 0.0, 0.0]])  # chooses action 1 in row 0
    >>> worst_attack_target(q, adm, tf.constant([1.0, 2.0]), tf.constant([False, True]), 0.5,
    ...                     q_select=online).numpy().tolist()
    [2.5, 2.0]
    """
    q_next = tf.convert_to_tensor(q_next, tf.float32)
    inf = tf.constant(np.inf, tf.float32)
    if q_select is None:
        worst = tf.reduce_min(tf.where(admissible, q_next, inf), axis=-1)
    else:
        choice = tf.argmin(tf.where(admissible, tf.cast(q_select, tf.float32), inf), axis=-1)
        worst = tf.gather(q_next, choice, batch_dims=choice.shape.rank)
    alive = 1.0 - tf.cast(terminated, tf.float32)
    return tf.stop_gradient(tf.cast(rewards, tf.float32) + gamma * alive * worst)


def state_importance(q: tf.Tensor) -> tf.Tensor:
    """The importance ``ω(s)`` of each state ``[B]``: the spread ``max_a q(a) − min_a q(a)`` of
    ``q [B, A]`` normalised to mean 1 over the batch (all ones when every spread is 0);
    stopped. On the seed axis ``q [S, B, A]`` -> ``[S, B]``, each seed's normalised over its
    own rows.

    >>> state_importance(tf.constant([[1.0, 4.0], [2.0, 1.0]])).numpy().tolist()
    [1.5, 0.5]
    """
    spread = tf.reduce_max(q, axis=-1) - tf.reduce_min(q, axis=-1)
    # one seed: the batch's mean; the seed axis ([S, B, A]): each seed's over its own rows
    mean = tf.reduce_mean(spread) if spread.shape.rank == 1 else \
        tf.reduce_mean(spread, axis=-1, keepdims=True)
    return tf.stop_gradient(tf.where(mean > 0.0, spread / tf.maximum(mean, 1e-12),
                                     tf.ones_like(spread)))


def _standardize(x: tf.Tensor) -> tf.Tensor:
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) / (tf.sqrt(var) + 1e-8)


def check_wocar_agent(agent: Agent, method: str) -> PolicySurface:
    """The agent's policy surface if WocaR can train it (an on-policy actor-critic with a
    discrete policy or a Gaussian one on Box actions with finite bounds, or a DQN; a policy
    network the bound engine bounds with ``method``); else a
    :class:`robustgrad.errors.ConfigError` naming the argument (the layer, for a network the
    engine cannot bound). An agent of ``S > 1`` seeds gives its seed-axis surface
    (observations ``[S, B, d]``, each seed's own network; the probe bounds seed 0's)."""
    surface = _surface(agent)
    if not agent.discrete:
        low, high = surface.action_low, surface.action_high
        if low is None or high is None or not (np.all(np.isfinite(low))
                                               and np.all(np.isfinite(high))):
            raise ConfigError(f"env: WocaR on Box actions needs finite action bounds (the "
                              f"worst-attack critic's action input and the admissible box are "
                              f"clipped to them); {agent.config.env!r} has "
                              f"{agent.env.single_action_space}")
    layers = surface.layers if surface.num_seeds is None else \
        None if surface.seed_layers is None else [(w[0], b[0]) for w, b in surface.seed_layers]
    if layers is None:
        raise ConfigError("policy network: its policy surface declares no affine layers "
                          "(PolicySurface(layers=...)); the bound engine cannot bound it")
    weights = [w for w, _ in layers]
    biases = [b for _, b in layers]
    box = tf.zeros([1, int(weights[0].shape[0])])
    try:  # a static probe: the engine names the layer it cannot take
        affine_stack_bounds(weights, biases, surface.activation or "linear", box, box,
                            method=method)
    except ValueError as exc:
        raise ConfigError(f"policy network: the bound engine cannot bound it ({exc})") from None
    return surface


def _worst_attack_critic(agent: Agent, learning_rate: float) -> tuple[MLP, MLP, Any, Any]:
    """The worst-attack action-value network ``Q_w(s, .)`` ``[B, A]`` (Box actions: ``Q_w(s,
    a)``, ``[B, d + k] -> [B, 1]``; the agent's hidden sizes and activation, seeded
    ``seed + 2``), its target copy (same initial weights), the
    critic's Adam step (``learning_rate``, the agent's gradient-norm clip) and that
    Adam's state (:class:`agents.core._step.AdamSlots`), built in that order (a seeded run's
    variables do not move). On the seed axis (``S > 1`` seeds): each network holds ``S``
    stacked copies (``[S, ...]``, copy ``s`` seeded ``seeds[s] + 2``: the network of seed ``s``
    alone) and the step is the per-seed Adam
    (:func:`agents.core._step.make_seed_axis_step`: each seed clipped, guarded and stepped on
    its own; one object, both step and state)."""
    cfg = agent.config
    in_dim = int(np.prod(agent.obs_shape))
    if agent.discrete:
        n_out = int(agent.env.single_action_space.n)
    else:  # Box actions: Q_w(s, a) of the observation and the action, [d + k] -> [1]
        in_dim, n_out = in_dim + int(np.prod(agent.env.single_action_space.shape)), 1
    hidden = tuple(cfg.hidden_sizes)
    seeds = list(getattr(agent, "seeds", [cfg.seed]))
    seed = layer_seed([s + 2 for s in seeds])  # one seed: cfg.seed + 2, plain variables
    critic = MLP(in_dim, hidden, n_out, cfg.activation, 1.0, seed, name="wocar_critic")
    target = MLP(in_dim, hidden, n_out, cfg.activation, 1.0, seed, name="wocar_target")
    step, slots = make_seed_axis_step(critic.trainable_variables, learning_rate,
                                      cfg.max_grad_norm, None, len(seeds))
    return critic, target, step, slots


class _WorstCaseWeighted(ScheduledPlugin):
    """What WocaR's PPO and DQN plug-ins share: the settings (``self.spec``, the config's
    :class:`agents.WocaR` with WocaR's defaults filled in), the eps/kappa schedule over
    ``spec.warmup``, the worst-case weight ``self.weight`` ramped from 0 to
    ``self.target_weight`` as eps (or over the whole run with ``spec.weight_over_run``), the
    policy surface (checked), the worst-attack networks of :func:`_worst_attack_critic` (in the
    agent's checkpoint, :meth:`checkpoint_modules`), and the weight and the ``_stats``
    variables logged after each iteration. A subclass sets ``_stats`` in its ``__init__``
    (:meth:`_stat_variables`).

    The seed axis (``num_seeds = S > 1``, DESIGN.md sections 7-8): the hooks take the agent's
    ``[S, B, ...]`` tensors (one seed's plug-in sees its own ``[B, ...]``,
    :func:`agents.core.plugin.on_seed_axis`); the worst-attack networks and their Adam carry the
    axis (:func:`_worst_attack_critic`), every loss is ``[S]`` (each seed's mean over its own
    rows, the tape differentiating their sum: each seed's gradient its own), the admissible sets
    are one bound call on the block-diagonal network of the ``S`` policies
    (:mod:`agents.robustness.certify`), each ``_stats`` entry is ``[S]`` (logged as the mean,
    and each seed's under ``"per_seed"`` and in its ``history``), and the random draws are each
    seed's own (``agent.streams``, as PPO's minibatch order: :meth:`_keys`)."""

    _stats: dict[str, tf.Variable]

    def __init__(self, agent: Agent):
        spec = WocaRConfig.from_config(agent.config)
        assert isinstance(spec, WocaRConfig)
        value_based = bool(getattr(agent, "value_based", False))
        self.spec: WocaRSettings = spec.settings(
            value_based=value_based, box=not value_based and not agent.discrete)
        super().__init__(agent, warmup=self.spec.warmup)
        self.bound = self.spec.bound
        self.target_weight = self.spec.weight
        self.gamma = float(agent.config.gamma) if self.spec.gamma is None else self.spec.gamma
        self.surface = check_wocar_agent(agent, self.bound)
        self.num_seeds = int(getattr(agent, "num_seeds", 1))
        self.critic, self.target, self.critic_step, self.critic_optimizer = \
            _worst_attack_critic(agent, self.spec.q_lr)
        self.weight = tf.Variable(0.0 if self.spec.warmup > 0 else self.target_weight,
                                  trainable=False, name="wocar_weight")

    # -- the seed axis ---------------------------------------------------------------------------
    def _stat_variables(self, names: tuple[str, ...]) -> dict[str, tf.Variable]:
        """The logged statistics: a scalar variable per name, ``[S]`` on the seed axis."""
        lead = () if self.num_seeds == 1 else (self.num_seeds,)
        return {k: tf.Variable(tf.zeros(lead), trainable=False, name=k) for k in names}

    def _seed_mean(self, x: tf.Tensor) -> tf.Tensor:
        """The mean of ``x`` over everything (one seed: a scalar) or over all but the seed axis
        (``[S]``)."""
        if self.num_seeds == 1:
            return tf.reduce_mean(x)
        return tf.reduce_mean(x, axis=list(range(1, x.shape.rank)))

    def _keys(self) -> tf.Tensor:
        """A fresh stateless key: ``[2]`` from the agent's stream (one seed, as before), or
        ``[S, 2]``, one from each seed's own stream (``agent.streams``), as each seed alone
        draws its key at the same point."""
        if self.num_seeds == 1:
            return self.agent.draw_seed()
        return cast(Any, self.agent).streams.keys()  # PPO, A2C and DQN hold each seed's

    def _step_critic(self, grads: list[tf.Tensor]) -> None:
        """One Adam step of the worst-attack critic (each seed's own on the seed axis)."""
        if self.num_seeds == 1:
            self.critic_step.step(grads)
        else:
            step_on_axis(self.critic_step, grads)

    def seed_axis_state(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """``(per seed, shared)`` variables of the worst-attack networks for
        :func:`agents.backends.seed_axis.export_seed` and ``import_seed``: both networks,
        Adam's moments and count (``[S, ...]`` on the seed axis; one seed's shapes those of an
        ordinary agent); the learning rate."""
        opt = self.critic_optimizer
        per_seed = list(self.critic.trainable_variables) + \
            list(self.target.trainable_variables) + list(opt.m) + list(opt.v) + [opt.iterations]
        return per_seed, [opt.learning_rate]

    def _selector(self, next_obs: tf.Tensor) -> tf.Tensor | None:
        """The values that choose the worst admissible next action of the critic's target:
        the online critic's with ``spec.double`` (the paper's code), else ``None`` (the target
        network's own min)."""
        return self.worst_q(next_obs, target=False) if self.spec.double else None

    def worst_q(self, obs: tf.Tensor, target: bool = True) -> tf.Tensor:
        """``Q_w(obs, .)`` ``[B, A]`` of the target network (``target=False``: the critic) at
        raw observations (the agent's observation normaliser applied, read live)."""
        net = self.target if target else self.critic
        return net(self.surface.normalize(tf.convert_to_tensor(obs, tf.float32)))

    def _polyak(self) -> None:
        """The target network one step (rate ``spec.tau``) toward the critic."""
        tau = self.spec.tau
        for src, dst in zip(self.critic.trainable_variables, self.target.trainable_variables):
            dst.assign((1.0 - tau) * dst + tau * src)

    def before_iteration(self, steps_done: int, total: int) -> dict:
        super().before_iteration(steps_done, total)
        warmup = 1.0 if self.spec.weight_over_run else self.spec.warmup
        frac = 1.0 if warmup <= 0 else linear(0.0, 1.0, float(steps_done), warmup * float(total))
        self.weight.assign(self.target_weight * frac)
        return {}

    def after_iteration(self, logs: dict, extra: dict) -> None:
        super().after_iteration(logs, extra)
        logs["wocar_weight"] = float(self.weight.numpy())
        if self.num_seeds == 1:
            logs.update({k: float(v.numpy()) for k, v in self._stats.items()})
            return
        per_seed = {k: v.numpy().astype(np.float64).tolist() for k, v in self._stats.items()}
        logs.update({k: float(np.mean(v)) for k, v in per_seed.items()})
        logs.setdefault("per_seed", {}).update(per_seed)

    def record(self, logs: dict) -> None:
        """The iteration's ``wocar_*`` numbers (:meth:`after_iteration`) also in its
        ``agent.history`` entry (their means over the seeds) and, on the seed axis, each seed's
        own in its ``seed_histories`` entry."""
        super().record(logs)
        entry = self.agent.history[-1] if self.agent.history else None
        if entry is not None and entry.get("steps") == logs.get("steps"):
            entry.update({k: v for k, v in logs.items() if k.startswith("wocar_")})
        if self.num_seeds > 1:
            per_seed = logs.get("per_seed", {})
            for k, history in enumerate(self.agent.seed_histories):
                if history and history[-1].get("steps") == logs.get("steps"):
                    history[-1]["wocar_weight"] = logs["wocar_weight"]
                    history[-1].update({name: per_seed[name][k] for name in self._stats
                                        if name in per_seed})

    def checkpoint_modules(self) -> dict[str, Any]:
        """The worst-attack network, its target copy, its Adam state and gradient step: in the
        agent's checkpoint (``robustness/``), so a loaded agent that learns again goes on with
        the critic it had (the weight and eps are recomputed from the step counts)."""
        return {"critic": self.critic, "target": self.target,
                "optimizer": self.critic_optimizer, "gradient_step": self.critic_step}


class WocaRPlugin(_WorstCaseWeighted):
    """``robust="wocar"``: the worst-attack critic, the worst-case-aware advantages and the
    importance-weighted smoothness term (module doc). Its logs: ``wocar_weight`` (the schedule's
    ``w``), ``wocar_q_loss`` (the critic's last minibatch loss), ``wocar_worst_q`` (mean
    ``Q_w^-(s, a)`` over the rollout), ``wocar_admissible`` (mean admissible actions per next
    state).

    ``critic``, ``target``: the worst-attack networks ``[d] -> [A]``; ``critic_step``: their
    Adam step."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self._stats = self._stat_variables(("wocar_q_loss", "wocar_worst_q",
                                            "wocar_admissible"))
        self._rollout_inputs: tuple[Any, tuple[tf.Tensor, ...]] | None = None

    # -- the worst-attack critic ----------------------------------------------------------------
    def _fit_critic(self, batch: dict, admissible: tf.Tensor) -> tf.Tensor:
        """:meth:`_critic_epochs` on the rollout's transitions, the target
        :func:`worst_attack_target` over each next state's admissible actions."""
        # the networks' inputs normalised once for the whole rollout (element-wise: the rows
        # each step gathers are those it would normalise; the normaliser moves after the update)
        obs = self.surface.normalize(batch["obs"])
        nxt = self.surface.normalize(batch["next_obs"])
        gamma = self.gamma

        def target(o, a, r, s2, t, adm):
            return worst_attack_target(self.target(s2), adm, r, t, gamma,
                                       self.critic(s2) if self.spec.double else None)

        def value(o, a, *_):  # the taken action's value by a one-hot product (exact: q·1 + 0)
            return tf.reduce_sum(self.critic(o) * a, axis=-1)

        # one-hot once per rollout: each step's read is a product, not a gather and its
        # gradient's scatter (same numbers, ~100 fewer ops in the loop)
        taken = tf.one_hot(batch["actions"], int(self.agent.env.single_action_space.n))
        return self._critic_epochs((obs, taken, batch["rewards"], nxt,
                                    batch["terminated"], admissible), target, value)

    def _critic_epochs(self, rollout: tuple, target: Callable[..., tf.Tensor],
                       value: Callable[..., tf.Tensor]) -> tf.Tensor:
        """``spec.q_epochs`` epochs of ``spec.q_minibatches`` steps of the worst-attack critic
        on the rollout's tensors ``rollout`` (each ``[n, ...]``, in the same row order): each
        step gathers a minibatch of rows, takes ``target(*rows)`` (from the target network,
        outside the tape) and one Adam step on ``mean((value(*rows) - target)^2)``, then the
        target network's Polyak update; each epoch's shuffle is drawn once, before the loop, and
        the rows of every step are one row of an index matrix (one read per step). A
        rollout of fewer rows than ``spec.q_minibatches`` gives one minibatch per row (never an
        empty one). Returns the last minibatch loss.

        On the seed axis each tensor is ``[S, n, ...]``: each seed's shuffles from its own key
        (:meth:`_keys`, drawn as alone), its rows gathered from its own slice, the loss ``[S]``
        (each seed's mean; one Adam step of each seed's own gradient)."""
        axis = 0 if self.num_seeds == 1 else 1  # the rows' axis
        n = int(rollout[0].shape[axis])
        epochs, minibatches = self.spec.q_epochs, min(self.spec.q_minibatches, n)
        mb = n // minibatches

        def shuffles(seed):  # [epochs, n]
            return tf.stack([tf.argsort(tf.random.stateless_uniform(
                [n], seed=tf.random.experimental.stateless_fold_in(seed, epoch)))
                for epoch in range(epochs)])

        steps = epochs * minibatches
        if self.num_seeds == 1:  # step i's rows: index[i], [mb] (epoch i // M, slice i % M)
            index = tf.reshape(shuffles(self._keys())[:, :minibatches * mb], [steps, mb])
        else:  # [steps, S, mb]: each seed's shuffles as alone
            perms = stateless_per_seed(shuffles, self._keys(), axis=True)  # [S, epochs, n]
            index = tf.transpose(tf.reshape(perms[..., :minibatches * mb],
                                            [self.num_seeds, steps, mb]), [1, 0, 2])

        def step(i, loss):
            idx = tf.gather(index, i)  # [mb], or [S, mb]
            rows = [tf.gather(x, idx, axis=axis, batch_dims=axis) for x in rollout]
            goal = target(*rows)
            with tf.GradientTape() as tape:
                loss = self._seed_mean(tf.square(value(*rows) - goal))
            self._step_critic(tape.gradient(loss, self.critic.trainable_variables))
            self._polyak()
            return i + 1, loss

        _, loss = tf.while_loop(lambda i, _: i < steps, step,
                                (tf.constant(0), tf.zeros([self.num_seeds] if axis else [])))
        return loss

    # -- the plug-in hooks ---------------------------------------------------------------------
    @_plain
    def shape_advantages(self, batch: dict, advantages: tf.Tensor) -> tf.Tensor:
        """Fit the worst-attack critic on the rollout, then ``n(A) + w · n(Q_w^-(s, a))``; and
        the regulariser's inputs for the whole rollout (:meth:`rollout_regularizer_inputs`),
        kept for the update's minibatches (:meth:`regularizer_inputs`)."""
        radius = self.schedule.eps if self.spec.admissible_eps is None else \
            self.spec.admissible_eps
        admissible = admissible_actions(_surface(self.agent), batch["next_obs"], radius,
                                        self.bound)
        loss = self._fit_critic(batch, admissible)
        q_obs = self.worst_q(batch["obs"])  # read once: the objective's and the importance's
        actions = batch["actions"]
        worst = tf.stop_gradient(tf.gather(q_obs, actions, batch_dims=actions.shape.rank))
        self._stats["wocar_q_loss"].assign(loss)
        self._stats["wocar_worst_q"].assign(self._seed_mean(worst))
        self._stats["wocar_admissible"].assign(
            self._seed_mean(tf.reduce_sum(tf.cast(admissible, tf.float32), axis=-1)))
        if self.spec.search_per_rollout:
            self._rollout_inputs = (_current_graph(), self._network_inputs(
                self.rollout_regularizer_inputs(batch["obs"], q_obs)))
        return _standardize(advantages) + self.weight * _standardize(worst)

    def rollout_regularizer_inputs(self, obs: tf.Tensor,
                                   q: tf.Tensor | None = None) -> tuple[tf.Tensor, ...]:
        """The regulariser's inputs for the rollout's ``obs [B, d]``, all stopped: the clean
        log-probabilities ``[B, A]`` of the policy as it collected the rollout, ``s_hat [B, d]``
        (the ``robust_method`` search at the schedule's eps, ``robust_steps`` steps) and the
        importance ``ω(s) [B]``. Computed once per rollout, not once per minibatch and epoch:
        the search is most of the method's cost (``robust_steps`` forward and backward passes
        on each call) and PPO's clipped epochs move the policy little; each update step still
        differentiates ``pi(.|s_hat)`` through the current weights. ``q``: ``Q_w^-(obs, .)``
        ``[B, A]`` when the caller has it (else read here)."""
        cfg, surface = self.agent.config, _surface(self.agent)
        obs = tf.stop_gradient(obs)
        clean = tf.stop_gradient(tf.nn.log_softmax(surface.outputs(obs)))
        obs_adv = sa_observations(self.agent, obs, self.schedule.eps, cfg.robust_steps,
                                  self._search_key(), cfg.robust_method)
        if q is None and self.spec.importance:
            q = self.worst_q(obs)
        importance = state_importance(q) if self.spec.importance else \
            tf.ones(tf.shape(obs)[:-1])
        return clean, obs_adv, importance

    def _search_key(self) -> tf.Tensor:
        """The key ``[2]`` of the smoothness term's search: one draw (one seed), or on the seed
        axis each seed's own draw (:meth:`_keys`: each stream moves as alone) of which seed
        0's keys the one engine call for all seeds (as SA's search on the axis: the random
        start of seed ``s > 0`` is not the one it draws alone)."""
        keys = self._keys()
        return keys if self.num_seeds == 1 else keys[0]

    def _network_inputs(self, inputs: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, ...]:
        """:meth:`rollout_regularizer_inputs` with ``s_hat`` normalised (the network's input
        ``x_hat``): once per rollout, not at each update step (the normaliser moves after the
        update; element-wise, so the same numbers)."""
        clean, obs_adv, importance = inputs
        return clean, _surface(self.agent).normalize(obs_adv), importance

    @_plain
    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        """The rollout's inputs kept by :meth:`shape_advantages` when called in the same
        compiled update (the term is then the rollout's mean, whatever the minibatch); else
        those of ``obs`` itself; ``s_hat`` as the network's input (:meth:`_network_inputs`)."""
        kept = getattr(self, "_rollout_inputs", None)
        if kept is not None and _within(kept[0]):
            return kept[1]
        return self._network_inputs(self.rollout_regularizer_inputs(obs))

    @_plain
    def regularizer(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        if inputs is None:
            return super().regularizer(obs, inputs)
        clean, x_adv, importance = inputs
        adv = tf.nn.log_softmax(_surface(self.agent).network(x_adv))
        kl = tf.reduce_sum(tf.exp(clean) * (clean - adv), axis=-1)
        term = self._seed_mean(importance * kl)  # [S] on the seed axis: each seed's own
        return self.schedule.kappa * term, term


class WocaRBoxPlugin(WocaRPlugin):
    """``robust="wocar"`` for a Gaussian policy on Box actions (PPO, A2C; the paper's MuJoCo
    WocaR-PPO), the discrete plug-in's three pieces with actions in a box
    (:mod:`agents.robustness.wocar_box`):

    1. **the admissible actions** at ``s'``: the box ``[lb, ub]`` of the Gaussian mean over the
       ball (``wocar_bound``: IBP, CROWN or CROWN-IBP) clipped to the action bounds
       (:func:`agents.robustness.wocar_box.admissible_box`);
    2. **the worst-attack critic** ``Q_w(s, a)``, an MLP ``[d + k] -> [1]`` of the normalised
       observation and the action mapped to ``[-1, 1]``
       (:func:`agents.robustness.wocar_box.action_to_unit`), trained toward ``r + gamma ·
       (1 − terminated) · min(Q_w^-(s', a*), Q_w^-(s', mu(s')))``: ``a*`` the worst action of
       the box for ``Q_w^-`` (``wocar_double``: for the online ``Q_w``), searched once per
       rollout on its next states (``wocar_search_steps`` projected sign steps after the box's
       corners, default 10, :func:`agents.robustness.wocar_box.worst_action_in_box`) and revalued by the
       moving target network at each critic step; the clean mean ``mu(s')`` (clipped) is in
       the min, so the target never exceeds the clean action's (:meth:`worst_next_values`);
    3. **the objective and the regulariser**: ``n(A) + w · n(Q_w^-(s, a))`` at the rollout's
       actions ``a``, and ``kappa · mean_s ω(s) · KL(pi(.|s) || pi(.|s_hat))`` (Gaussian KL,
       the clean mean and ``log σ`` stopped), ``ω(s)`` the spread ``max_a Q_w^- − min_a Q_w^-``
       over the whole action space (two searches, :func:`agents.robustness.wocar_box.
       q_spread_in_box`) normalised to mean 1.

    Logs as the discrete plug-in's; ``wocar_admissible`` is the mean width of the admissible
    box (summed over action dimensions, in action units) at the rollout's next states. The
    cost per rollout of ``B`` states and ``k`` action dimensions (``k <= 4``): one bound pass
    of ``B`` boxes, three searches of ``2^k + 1`` forward and ``wocar_search_steps`` forward and
    backward passes of ``Q_w`` on ``B`` rows (the target's, and the importance's min and max),
    and the discrete plug-in's critic epochs."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        low, high = self.surface.action_low, self.surface.action_high
        assert low is not None and high is not None  # check_wocar_agent
        self.action_low, self.action_high = low, high

    def q_at(self, obs: tf.Tensor, actions: tf.Tensor, target: bool = True) -> tf.Tensor:
        """``Q_w(obs, actions)`` ``[B]`` of the target network (``target=False``: the critic)
        at raw ``obs [B, d]`` and actions ``[B, k]`` in the env's units (clipped to its
        bounds)."""
        net = self.target if target else self.critic
        x = self.surface.normalize(tf.convert_to_tensor(obs, tf.float32))
        a = action_to_unit(actions, self.action_low, self.action_high)
        return net(tf.concat([x, a], axis=-1))[..., 0]

    def worst_q(self, obs: tf.Tensor, target: bool = True) -> tf.Tensor:
        raise TypeError("worst_q: a Box-action worst-attack critic takes actions too; use "
                        "q_at(obs, actions)")

    def _clean_actions(self, obs: tf.Tensor) -> tf.Tensor:
        """The policy's mean at ``obs`` clipped to the action bounds, stopped."""
        return tf.stop_gradient(self.surface.deterministic_actions(obs))

    def worst_actions(self, next_obs: tf.Tensor, eps: float | tf.Tensor) -> tuple[tf.Tensor, ...]:
        """``(a* [B, k], clean [B, k], lower [B, k], upper [B, k])``: the worst action of the
        admissible box at ``next_obs`` for the target network (the critic with
        ``wocar_double``), the clean (clipped) mean and the box; stopped."""
        lower, upper = admissible_box(self.surface, next_obs, eps, self.bound)
        clean = self._clean_actions(next_obs)
        double = self.spec.double
        a_star, _ = worst_action_in_box(lambda a: self.q_at(next_obs, a, target=not double),
                                        lower, upper, clean, self.spec.search_steps)
        return a_star, clean, lower, upper

    def worst_next_values(self, next_obs: tf.Tensor, a_star: tf.Tensor,
                          clean: tf.Tensor) -> tf.Tensor:
        """``min(Q_w^-(s', a*), Q_w^-(s', clean))`` ``[B]``, stopped: never above the target
        network's value of the clean action."""
        return tf.stop_gradient(tf.minimum(self.q_at(next_obs, a_star),
                                           self.q_at(next_obs, clean)))

    def _fit_box_critic(self, batch: dict, a_star: tf.Tensor, clean: tf.Tensor) -> tf.Tensor:
        """:meth:`WocaRPlugin._critic_epochs` with :meth:`worst_next_values` in the target."""
        gamma = self.gamma

        def target(o, a, r, s2, t, w, c):
            alive = 1.0 - tf.cast(t, tf.float32)
            return tf.stop_gradient(tf.cast(r, tf.float32) + gamma * alive *
                                    self.worst_next_values(s2, w, c))

        def value(o, a, *_):
            return self.q_at(o, a, target=False)

        return self._critic_epochs((batch["obs"], batch["actions"], batch["rewards"],
                                    batch["next_obs"], batch["terminated"], a_star, clean),
                                   target, value)

    @_plain
    def shape_advantages(self, batch: dict, advantages: tf.Tensor) -> tf.Tensor:
        """Fit the worst-attack critic on the rollout, then ``n(A) + w · n(Q_w^-(s, a))``; the
        regulariser's inputs for the whole rollout kept (as the discrete plug-in)."""
        radius = self.schedule.eps if self.spec.admissible_eps is None else \
            self.spec.admissible_eps
        a_star, clean, lower, upper = self.worst_actions(batch["next_obs"], radius)
        loss = self._fit_box_critic(batch, a_star, clean)
        worst = tf.stop_gradient(self.q_at(batch["obs"], batch["actions"]))
        self._stats["wocar_q_loss"].assign(loss)
        self._stats["wocar_worst_q"].assign(self._seed_mean(worst))
        self._stats["wocar_admissible"].assign(
            self._seed_mean(tf.reduce_sum(upper - lower, axis=-1)))
        if self.spec.search_per_rollout and self.schedule.target_kappa > 0.0:
            self._rollout_inputs = (_current_graph(),
                                    self.rollout_regularizer_inputs(batch["obs"]))
        return _standardize(advantages) + self.weight * _standardize(worst)

    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        """``None`` (no term, no search) when ``kappa`` is 0; else as the discrete plug-in."""
        if self.schedule.target_kappa <= 0.0:
            return None
        return super().regularizer_inputs(obs)

    def rollout_regularizer_inputs(self, obs: tf.Tensor,
                                   q: tf.Tensor | None = None) -> tuple[tf.Tensor, ...]:
        """``(clean mean [B, k], clean log σ [k], s_hat [B, d], ω(s) [B])``, all stopped (as
        the discrete plug-in's; ``ω`` from :func:`agents.robustness.wocar_box.q_spread_in_box`
        of ``Q_w^-`` over the action space; ``q`` is not read)."""
        cfg, surface = self.agent.config, self.surface
        obs = tf.stop_gradient(obs)
        mean = tf.stop_gradient(surface.outputs(obs))
        log_std = tf.stop_gradient(tf.cast(surface.log_std, tf.float32))  # [k], or [S, k]
        obs_adv = sa_observations(self.agent, obs, self.schedule.eps, cfg.robust_steps,
                                  self._search_key(), cfg.robust_method)
        if self.spec.importance:
            ones = tf.ones_like(mean)
            spread = q_spread_in_box(lambda a: self.q_at(obs, a), ones * self.action_low,
                                     ones * self.action_high, self._clean_actions(obs),
                                     self.spec.search_steps)
            importance = state_importance(tf.stack([spread, tf.zeros_like(spread)], -1))
        else:
            importance = tf.ones(tf.shape(obs)[:-1])
        return mean, log_std, obs_adv, importance

    def regularizer(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        if inputs is None:
            return ScheduledPlugin.regularizer(self, obs, inputs)
        mean, log_std, obs_adv, importance = inputs
        std = tf.exp(self.surface.per_row(log_std)) * tf.ones_like(mean)
        clean = tfd.Independent(tfd.Normal(mean, std), reinterpreted_batch_ndims=1)
        kl = tfd.kl_divergence(clean, self.surface.distribution(obs_adv))
        term = self._seed_mean(importance * kl)  # [S] on the seed axis: each seed's own
        return self.schedule.kappa * term, term


def _current_graph() -> Any:
    """The graph being built (``None`` when executing eagerly)."""
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _within(graph: Any) -> bool:
    """Whether the graph being built is ``graph`` or nested in it (a loop body of it): its
    tensors can be read here. Eagerly, whether ``graph`` is ``None`` too."""
    current = _current_graph()
    if graph is None or current is None:
        return graph is None and current is None
    while current is not None:
        if current is graph:
            return True
        current = getattr(current, "outer_graph", None)
    return False


def worst_case_bound_loss(lb: tf.Tensor, ub: tf.Tensor, q: tf.Tensor, actions: tf.Tensor,
                          target: tf.Tensor, delta: float = 1.0,
                          scale: float | tf.Tensor = 1.0) -> tf.Tensor:
    """WocaR-DQN's worst-case term per row ``[B]``: ``sum_a huber(max(|ub_a − ref_a|,
    |lb_a − ref_a|))`` with ``ref`` the TD ``target`` at the taken action and the clean
    ``q(a)`` at the others, ``[lb, ub]`` the bounds ``[B, A]`` of the Q-values over the eps
    ball: how far the ball lets each Q-value stray from what it should be. ``q [B, A]``
    (differentiable), ``actions [B]`` int, ``target [B]`` (stopped by the caller);
    ``delta``: the Huber threshold; ``scale`` (> 0, scalar, stopped by the caller): the
    residuals are measured in units of ``scale`` and the loss given back in the Q-values'
    units, ``scale · huber(x / scale)`` (on the seed axis, ``[S, B, A]`` inputs, ``scale``
    may be ``[S]``: each seed's own -> ``[S, B]``): ``scale=1`` is the paper's term; with ``scale`` the
    Q-values' size, the term is quadratic while the ball moves each Q-value by less than
    ``delta · scale`` (a gradient that vanishes with the relative spread) and linear beyond,
    the same for every reward scale (:class:`WocaRDQNPlugin`).

    >>> lb, ub = tf.constant([[0.0, 1.0]]), tf.constant([[3.0, 2.0]])
    >>> q = tf.constant([[1.0, 1.5]])
    >>> # action 0 taken, target 2: |lb - 2| = 2 -> huber 1.5; action 1: 0.5 -> 0.125
    >>> worst_case_bound_loss(lb, ub, q, tf.constant([0]), tf.constant([2.0])).numpy().tolist()
    [1.625]
    >>> # scale 4: x / 4 = 0.5 and 0.125, both quadratic: 4 * (0.125 + 0.0078125)
    >>> worst_case_bound_loss(lb, ub, q, tf.constant([0]), tf.constant([2.0]), scale=4.0
    ...                       ).numpy().tolist()
    [0.53125]
    """
    taken = tf.one_hot(actions, tf.shape(q)[-1]) > 0.5
    ref = tf.where(taken, tf.cast(target, tf.float32)[..., None], q)
    scale = tf.cast(scale, tf.float32)
    # the seed axis ([S] scales): each seed's scale, [S, 1] against its rows [S, B]
    row_scale = scale[:, None] if scale.shape.rank else scale
    x = tf.maximum(tf.abs(ub - ref), tf.abs(lb - ref)) / row_scale[..., None]
    per_action = tf.where(x <= delta, 0.5 * tf.square(x), delta * (x - 0.5 * delta))
    return row_scale * tf.reduce_sum(per_action, axis=-1)


def q_scale(target: tf.Tensor) -> tf.Tensor:
    """The Q-values' size on a batch, scalar, stopped: ``max(mean |target|, 1)`` of the TD
    ``target [B]`` (``[S]`` for ``[S, B]``: each seed's). The unit of WocaR-DQN's worst-case
    term (:func:`worst_case_bound_loss`'s ``scale``): 1 where the values are of order 1 (the
    paper's Atari rewards, clipped to [-1, 1]), their size where a return is larger (CartPole:
    up to ~1 / (1 - gamma) = 100).

    >>> float(q_scale(tf.constant([30.0, -50.0]))), float(q_scale(tf.constant([0.2, -0.1])))
    (40.0, 1.0)
    """
    size = tf.abs(tf.cast(target, tf.float32))
    # the seed axis (target [S, B]): each seed's own, [S]
    mean = tf.reduce_mean(size) if size.shape.rank == 1 else tf.reduce_mean(size, axis=-1)
    return tf.stop_gradient(tf.maximum(mean, 1.0))


class WocaRDQNPlugin(_WorstCaseWeighted):
    """``robust="wocar"`` for DQN (WocaR-DQN; the paper's DQN code, its RADIAL-based version):

    1. **the worst-attack Q-network** ``Q_w(s, a)``, one Adam step (``q_lr``, Huber) on the
       replayed minibatch of every ``q_every``-th gradient step of the agent (default 10, the
       paper's ``worst_rate``; :meth:`learn_from_replay`) toward
       :func:`worst_attack_target`: ``r + gamma · (1 −
       terminated) · min_{a' in A_adv(s')} Q_w^-(s', a')``, ``A_adv(s')`` the actions the
       attacker can make greedy for the agent's *own* Q-network within the schedule's eps
       (:func:`admissible_actions` at ``wocar_bound``), ``Q_w^-`` a Polyak-averaged target
       network (rate ``tau`` per step; the paper's code bootstraps from ``Q_w`` itself
       under ``no_grad``);
    2. **the worst-case-aware TD target**: the next action is ``argmax_a (1 − w) · S(s', a) +
       w · Q_w^-(s', a)`` (``S``: the algorithm's own scores, the online Q-values under Double
       DQN), valued by the target network (:meth:`target_action_scores`; ``w``:
       ``wocar_weight``, default 0.3, :attr:`agents.WocaR.DQN_DEFAULTS`, rising over
       ``warmup``, default 0.75);
    3. **the importance-weighted worst-case term**: the per-example loss is ``(1 − k) · TD +
       k · ω(s) · L_wc(s)`` (:meth:`q_loss`; ``k``: the schedule's ``robust_kappa``, the
       paper's ``1 − kappa_end``, 0.5 in its DQN code), ``L_wc``
       :func:`worst_case_bound_loss` from the online network's IBP bounds over the eps ball
       (the paper's; differentiable w.r.t. the weights; ``wocar_bound`` chooses the
       admissible sets' method only) measured in units of the batch's
       Q scale (:func:`q_scale`: ``max(mean |TD target|, 1)``; the paper's term where the
       values are of order 1, as its clipped Atari rewards make them; CartPole's are ~10-100:
       docs/benchmarks/robust-rl.md, "WocaR-DQN") and ``ω(s)`` the state's
       importance, the spread ``max_a Q(s, a) − min_a Q(s, a)`` of the agent's own Q-values
       normalised to mean 1 (:func:`state_importance`; the paper's definition for value-based
       agents; its DQN code weights all states alike, as ``wocar_importance=False`` does).
       ``wocar_term="margin"`` puts SA-DQN's hinge on the greedy action's certified margin
       (:func:`certified_margin_hinge`, the bounds by ``wocar_bound``) in place of ``L_wc``;
       ``wocar_term_start`` keeps the term off for that fraction of the budget
       (:meth:`before_iteration`).

    The admissible set here is the tighter of the two sound rules: ``a`` is dropped when some
    ``j`` provably beats it (``ub(Q_a − Q_j) < 0``, the differences bounded as one network);
    the paper's code drops ``a`` when ``ub(Q_a) < max_j lb(Q_j)`` (intervals of each output),
    which admits a superset.

    No inner search: the smoothness term comes from the bound engine alone (``robust_method``
    and ``robust_steps`` are not read), so one gradient step costs a few forward passes more
    than vanilla DQN's (an IBP pass and its gradient; on every ``q_every``-th step the
    admissible sets and the worst-attack network's step), against SA-DQN's ``robust_steps``
    PGD steps. Logs: ``wocar_weight``, ``wocar_q_loss`` (the worst-attack
    network's last step), ``wocar_worst_q`` (its mean ``Q_w(s, a)`` there),
    ``wocar_admissible`` (mean admissible actions per next state), ``wocar_bound_loss`` (the
    last step's mean ``L_wc``), ``wocar_td_loss`` (its mean TD Huber loss), ``wocar_width``
    (its mean ``ub − lb`` of the Q-values over the ball), ``wocar_scale`` (its
    :func:`q_scale`). The networks are in the agent's checkpoint; on the seed axis every term is
    each seed's own (:class:`_WorstCaseWeighted`)."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self.huber_delta = float(cast("DQNConfig", agent.config).huber_delta)
        self._stats = self._stat_variables(("wocar_q_loss", "wocar_worst_q", "wocar_admissible",
                                            "wocar_bound_loss", "wocar_td_loss", "wocar_width",
                                            "wocar_scale"))
        self._replay_calls = tf.Variable(0, trainable=False, dtype=tf.int64,
                                         name="wocar_replay_calls")

    # -- the Q-learner's hooks -----------------------------------------------------------------
    def worst_attack_targets(self, batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
        """``(target [B], admissible [B, A])`` of a replayed ``batch``: the worst-attack Bellman
        targets (:func:`worst_attack_target` of the target network at ``next_obs``, stopped)
        and the admissible actions there for the agent's Q-network at the schedule's eps."""
        admissible = admissible_actions(self.surface, batch["next_obs"], self.schedule.eps,
                                        self.bound)
        target = worst_attack_target(self.worst_q(batch["next_obs"]), admissible,
                                     batch["rewards"], batch["terminated"], self.gamma,
                                     self._selector(batch["next_obs"]))
        return target, admissible

    @_plain
    def learn_from_replay(self, batch: dict) -> None:
        """One step of the worst-attack Q-network on the replayed minibatch (class doc, 1) on
        every ``spec.q_every``-th call (the first included), nothing on the others."""
        every = self.spec.q_every
        if every <= 1:
            self._worst_step(batch)
            return
        due = tf.equal(self._replay_calls % every, 0)
        self._replay_calls.assign_add(1)
        idle = tf.zeros([] if self.num_seeds == 1 else [self.num_seeds])
        tf.cond(due, lambda: self._worst_step(batch), lambda: idle)

    def _worst_step(self, batch: dict) -> tf.Tensor:
        """One Adam step of the worst-attack Q-network toward its targets on ``batch``, the
        target copy's Polyak step and the logs; returns the loss."""
        obs, actions = batch["obs"], batch["actions"]
        target, admissible = self.worst_attack_targets(batch)
        delta = self.huber_delta
        with tf.GradientTape() as tape:
            q = tf.gather(self.worst_q(obs, target=False), actions,
                          batch_dims=actions.shape.rank)
            err = tf.abs(q - target)
            loss = self._seed_mean(tf.where(err <= delta, 0.5 * tf.square(err),
                                            delta * (err - 0.5 * delta)))  # [S]: each seed's
        self._step_critic(tape.gradient(loss, self.critic.trainable_variables))
        self._polyak()
        self._stats["wocar_q_loss"].assign(loss)
        self._stats["wocar_worst_q"].assign(self._seed_mean(q))
        self._stats["wocar_admissible"].assign(
            self._seed_mean(tf.reduce_sum(tf.cast(admissible, tf.float32), axis=-1)))
        return loss

    def before_iteration(self, steps_done: int, total: int) -> dict:
        """The schedule's eps, kappa and weight (:class:`_WorstCaseWeighted`); with
        ``spec.term_start`` the term's kappa is 0 before that fraction of ``total``, then rises
        to full at ``spec.warmup`` (at once when that has passed)."""
        out = super().before_iteration(steps_done, total)
        start = self.spec.term_start
        if start > 0:
            begin, end = start * float(total), max(self.spec.warmup, start) * float(total)
            frac = 0.0 if steps_done < begin else \
                1.0 if end <= begin else min((steps_done - begin) / (end - begin), 1.0)
            self.schedule.kappa.assign(self.schedule.target_kappa * frac)
        return out

    def target_action_scores(self, next_obs: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
        """``(1 − w) · scores + w · Q_w^-(next_obs)`` (class doc, 2), stopped."""
        worst = self.worst_q(next_obs)
        return tf.stop_gradient((1.0 - self.weight) * scores + self.weight * worst)

    @_plain
    def q_loss(self, per_example: tf.Tensor, obs: tf.Tensor, actions: tf.Tensor,
               q: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        """``(1 − k) · per_example + k · ω(s) · L_wc(s)`` (class doc, 3)."""
        target = tf.stop_gradient(target)
        scale = q_scale(target)
        if self.spec.term == "margin":
            greedy = tf.argmax(tf.stop_gradient(q), axis=-1, output_type=tf.int32)
            _, margins = greedy_margin_lower_bounds(self.surface, tf.stop_gradient(obs),
                                                    self.schedule.eps, self.bound, greedy)
            wc = certified_margin_hinge(margins)
            self._stats["wocar_width"].assign(-self._seed_mean(tf.reduce_min(margins, -1)))
        else:
            lb, ub = output_bounds(self.surface, tf.stop_gradient(obs), self.schedule.eps,
                                   "ibp")
            wc = worst_case_bound_loss(lb, ub, q, actions, target, self.huber_delta, scale)
            self._stats["wocar_width"].assign(self._seed_mean(ub - lb))
        importance = state_importance(tf.stop_gradient(q)) if self.spec.importance else 1.0
        self._stats["wocar_bound_loss"].assign(self._seed_mean(wc))
        self._stats["wocar_td_loss"].assign(self._seed_mean(per_example))
        self._stats["wocar_scale"].assign(scale)
        k = self.schedule.kappa
        return (1.0 - k) * per_example + k * importance * wc


def _wocar(agent: Any) -> RobustnessPlugin:
    """The WocaR plug-in of ``agent``: WocaR-DQN for a Q-learner, else the actor-critic's."""
    if getattr(agent, "value_based", False):
        return WocaRDQNPlugin(agent)
    return WocaRPlugin(agent) if agent.discrete else WocaRBoxPlugin(agent)


register_robustness("wocar", _wocar)

