"""What every WocaR variant shares, and its plug-in for a discrete actor-critic.

The pieces of :mod:`agents.robustness.wocar` (Liang et al., NeurIPS 2022) that do not depend on
the action space or the algorithm: the admissible actions from :mod:`robustgrad.bounds`
(:func:`admissible_actions`), the worst-attack Bellman target (:func:`worst_attack_target`), the
state importance (:func:`state_importance`), the check of an agent WocaR can train
(:func:`check_wocar_agent`), the worst-attack networks with their per-seed Adam and the
schedule every plug-in shares (:class:`_WorstCaseWeighted`); and :class:`WocaRPlugin`, WocaR-PPO
and WocaR-A2C on a discrete policy. The Box-action plug-in is in
:mod:`agents.robustness.wocar_box`, WocaR-DQN in :mod:`agents.robustness.wocar_dqn`; the method
as a whole, its settings and costs, in :mod:`agents.robustness.wocar`.

>>> import tensorflow as tf
>>> q_next = tf.constant([[1.0, 3.0, 2.0]])
>>> allowed = tf.constant([[False, True, True]])   # the attacker can induce actions 1 and 2
>>> float(worst_attack_target(q_next, allowed, tf.constant([1.0]), tf.constant([False]), 0.5)[0])
2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import tensorflow as tf

from agents.core._step import make_seed_axis_step, step_on_axis
from agents.core.networks import MLP, layer_seed
from agents.core.schedules import linear
from agents.core.streams import stateless_per_seed
from agents.robustness._victim import _surface
from agents.robustness.certify import difference_upper_bounds
from agents.robustness.configs import WocaR as WocaRConfig
from agents.robustness.configs import WocaRSettings
from agents.robustness.robust import ScheduledPlugin, sa_observations
from robustgrad.bounds import affine_stack_bounds
from robustgrad.errors import ConfigError

if TYPE_CHECKING:
    from agents.core.base import Agent
    from agents.core.policy import PolicySurface

__all__ = ["WocaRPlugin", "admissible_actions", "check_wocar_agent", "state_importance",
           "worst_attack_target"]


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
        # the update steps taken since the iteration's shape_advantages (spec.smoothness_every);
        # reset there, so a resumed run counts as one that was never stopped
        self._update_steps = tf.Variable(0, trainable=False, dtype=tf.int64,
                                         name="wocar_update_steps")
        cfg = agent.config  # PPO: epochs x minibatches per update; A2C: one step
        self.steps_per_update = int(getattr(cfg, "n_epochs", 1)) * \
            int(getattr(cfg, "n_minibatches", 1))

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
        empty one); minibatches have at least ``spec.q_min_rows`` rows where the rollout has
        them (``min(q_minibatches, max(1, n // q_min_rows))`` of them). Returns the last
        minibatch loss.

        On the seed axis each tensor is ``[S, n, ...]``: each seed's shuffles from its own key
        (:meth:`_keys`, drawn as alone), its rows gathered from its own slice, the loss ``[S]``
        (each seed's mean; one Adam step of each seed's own gradient)."""
        axis = 0 if self.num_seeds == 1 else 1  # the rows' axis
        n = int(rollout[0].shape[axis])
        epochs = self.spec.q_epochs
        minibatches = min(self.spec.q_minibatches, max(1, n // self.spec.q_min_rows))
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
    @tf.autograph.experimental.do_not_convert
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
        self._update_steps.assign(0)
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

    @tf.autograph.experimental.do_not_convert
    def regularizer_inputs(self, obs: tf.Tensor) -> Any:
        """The rollout's inputs kept by :meth:`shape_advantages` when called in the same
        compiled update (the term is then the rollout's mean, whatever the minibatch); else
        those of ``obs`` itself; ``s_hat`` as the network's input (:meth:`_network_inputs`)."""
        kept = getattr(self, "_rollout_inputs", None)
        if kept is not None and _within(kept[0]):
            return kept[1]
        return self._network_inputs(self.rollout_regularizer_inputs(obs))

    @tf.autograph.experimental.do_not_convert
    def regularizer(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """``(kappa · term, term)`` of :meth:`smoothness_term` on update steps ``0, k, 2k, ...``
        of each iteration's update (``k = spec.smoothness_every``; counted from
        :meth:`shape_advantages`), both weighted ``n / ceil(n / k)`` (``n``:
        :attr:`steps_per_update`), so the weights of an update sum to ``n`` as with the term on
        every step; the steps between give zeros and skip the policy's pass on ``s_hat``,
        forward and backward. ``k = 1``, or an update of one step (A2C): every step, weight 1."""
        if inputs is None:
            return ScheduledPlugin.regularizer(self, obs, inputs)
        every, n = self.spec.smoothness_every, self.steps_per_update
        if every == 1 or n == 1:
            return self.smoothness_term(obs, inputs)
        weight = n / math.ceil(n / every)
        step = self._update_steps.assign_add(1) - 1
        lead = [] if self.num_seeds == 1 else [self.num_seeds]

        def on() -> tuple[tf.Tensor, tf.Tensor]:
            loss, term = self.smoothness_term(obs, inputs)
            return weight * loss, weight * term

        return tf.cond(tf.equal(step % every, 0), on, lambda: (tf.zeros(lead), tf.zeros(lead)))

    def smoothness_term(self, obs: tf.Tensor, inputs: Any) -> tuple[tf.Tensor, tf.Tensor]:
        """``(kappa · term, term)``: ``term = mean_s ω(s) · KL(pi(.|s) || pi(.|s_hat))`` from
        the inputs of :meth:`regularizer_inputs` (``[S]`` on the seed axis)."""
        clean, x_adv, importance = inputs
        adv = tf.nn.log_softmax(_surface(self.agent).network(x_adv))
        kl = tf.reduce_sum(tf.exp(clean) * (clean - adv), axis=-1)
        term = self._seed_mean(importance * kl)  # [S] on the seed axis: each seed's own
        return self.schedule.kappa * term, term
