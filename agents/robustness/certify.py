"""Certified actions and the bounds the SA convex regulariser needs, from the core's bound engine.

An agent's policy network (its :class:`agents.PolicySurface`: affine layers with tanh or ReLU, after
the observation normaliser) is bounded over the L∞ ball of radius ``eps`` around each observation,
in the agent's units (``s + δ · scale``, ``‖δ‖∞ ≤ eps``; ``scale`` the normaliser's std, or ones),
by :func:`robustgrad.bounds.affine_stack_bounds` (IBP, Gowal et al. 2018; CROWN, Zhang et al. 2018;
CROWN-IBP, Zhang et al. 2020). The normaliser is monotone per coordinate, so the ball's box maps
exactly to the box the network sees.

* **Certified actions** (discrete policies and DQN): the greedy action ``a*`` at ``s`` provably
  does not change within eps when the lower bound of every margin ``out(a*) − out(j)``, ``j ≠ a*``,
  is > 0 (the margin specification merged into the last layer: tighter than bounding the outputs
  and subtracting). :func:`certified_actions` per state, :func:`certified_fraction` of a batch of
  visited states, :func:`certify_agent` along the agent's own clean episodes.
* **Bounds for the convex regulariser** (Zhang et al. 2020, "Robust Deep Reinforcement Learning
  against Adversarial Perturbations on State Observations", the convex-relaxation variant of
  SA-PPO/SA-DQN): :func:`greedy_margin_lower_bounds`, :func:`difference_upper_bounds` and
  :func:`output_bounds` are unchecked and
  differentiable w.r.t. the weights, for use inside a compiled update (:mod:`agents.robustness.robust`).

>>> import numpy as np, agents
>>> dqn = agents.DQN(env="CartPole-v1", seed=0, preset=None, hidden_sizes=(16,))
>>> obs = np.random.default_rng(0).normal(size=[3, 4]).astype(np.float32)
>>> certified_actions(dqn, obs, eps=0.0).numpy().tolist()   # eps 0: nothing can change
[True, True, True]
>>> 0.0 <= certified_fraction(dqn, obs, eps=0.5) <= 1.0
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from agents.core.policy import PolicySurface
from agents.robustness._victim import _surface
from agents.robustness.episodes import _run_episodes
from robustgrad import checks as _checks
from robustgrad.bounds import affine_stack_bounds, margin_spec

__all__ = ["CERTIFY_METHODS", "certified_actions", "certified_fraction", "check_certifiable",
           "certified_rows", "certify_agent", "difference_upper_bounds",
           "greedy_margin_lower_bounds", "output_bounds"]

CERTIFY_METHODS = ("crown", "crown-ibp", "ibp")
"""Bound methods of :mod:`robustgrad.bounds` a certificate may use."""

_CHUNK = 1024  # states per bound call (CROWN's coefficients grow with the batch)


def check_certifiable(agent: Any, method: str = "crown", norm: str = "linf",
                      discrete: bool = True, argument: str = "agent") -> PolicySurface:
    """The agent's surface if its policy can be bounded by ``method`` over an ``norm`` ball
    (``discrete``: a certified action needs a discrete policy or a DQN); else ``ValueError``."""
    _checks.choice(method, "method", CERTIFY_METHODS)
    if _checks.norm_name(norm) != "linf":
        raise ValueError(f"norm: certified actions bound an L-inf ball (a box), got {norm!r}")
    surface = _surface(agent)
    if surface.num_seeds is not None:
        raise ValueError(f"{argument}: this agent holds {surface.num_seeds} seeds; "
                         "agent.export(s) gives seed s as an ordinary agent to certify")
    if surface.layers is None:
        raise ValueError(f"{argument}: its policy surface declares no affine layers "
                         "(PolicySurface(layers=...)); bound propagation needs them")
    if discrete and not surface.discrete:
        raise ValueError(f"{argument}: certified actions need a discrete policy or a DQN, got a "
                         f"{surface.kind!r} policy (continuous actions)")
    return surface


def _network_box(surface: PolicySurface, obs: tf.Tensor, eps: tf.Tensor | float
                 ) -> tuple[tf.Tensor, tf.Tensor]:
    """The box the network sees ``[B, d]`` (``[S, B, d]`` on a seed-axis surface; stopped) for
    the ball ``obs ± eps · scale``, each seed in its own units."""
    obs = tf.convert_to_tensor(obs, tf.float32)
    radius = tf.cast(eps, tf.float32) * surface.per_row(surface.obs_scale())
    lower, upper = surface.input_box(obs - radius, obs + radius)
    return tf.stop_gradient(lower), tf.stop_gradient(upper)


def _stack(surface: PolicySurface) -> tuple[list[tf.Variable], list[tf.Variable], str]:
    layers, act = surface.layers, surface.activation
    # check_certifiable refused a surface without layers; PolicySurface, layers without activation
    assert layers is not None and act is not None
    weights = [w for w, _ in layers]
    biases = [b for _, b in layers]
    return weights, biases, act


def _n_outputs(surface: PolicySurface) -> int:
    layers = surface.layers or surface.seed_layers
    assert layers is not None  # a surface that is bounded declares one or the other
    return int(layers[-1][0].shape[-1])


def _block_diagonal(w: tf.Tensor) -> tf.Tensor:
    """``S`` stacked matrices ``[S, a, b]`` as one block-diagonal ``[S * a, S * b]``.

    >>> _block_diagonal(tf.ones([2, 1, 2])).numpy().tolist()
    [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]
    """
    s, a, b = w.shape
    return tf.reshape(tf.einsum("sij,st->sitj", w, tf.eye(s, dtype=w.dtype)), [s * a, s * b])


def _side_by_side(x: tf.Tensor) -> tf.Tensor:
    """``[S, B, k]`` -> ``[B, S * k]``: row ``b`` holds every seed's row ``b`` (the input of the
    block-diagonal network)."""
    return tf.reshape(tf.transpose(x, [1, 0, 2]), [tf.shape(x)[1], -1])


def _per_seed(x: tf.Tensor, num_seeds: int) -> tf.Tensor:
    """The inverse of :func:`_side_by_side`: ``[B, S * k]`` -> ``[S, B, k]``."""
    return tf.transpose(tf.reshape(x, [tf.shape(x)[0], num_seeds, -1]), [1, 0, 2])


def _bounds(surface: PolicySurface, obs: tf.Tensor, eps: tf.Tensor | float, method: str,
            spec: tf.Tensor | None = None, lower_only: bool = False
            ) -> tuple[tf.Tensor, tf.Tensor]:
    """Bounds ``(lb, ub)`` of the outputs (or of ``spec @ outputs``; ``spec [N, m, k]``, one per
    row of ``obs`` in row-major order) over the ball: ``[B, m]`` for ``obs [B, d]``; on a
    seed-axis surface ``[S, B, m]`` for ``obs [S, B, d]``, each seed's through its own network,
    by one bound call on the block-diagonal network of the ``S`` stacked ones (no weight couples
    two blocks, so each block's bounds are its seed's own). ``lower_only`` (with ``spec``):
    ``ub`` is None, its backward pass skipped."""
    lower, upper = _network_box(surface, obs, eps)
    if surface.num_seeds is None:
        weights, biases, act = _stack(surface)
        return affine_stack_bounds(weights, biases, act, lower, upper, method=method, C=spec,
                                   lower_only=lower_only)
    n = surface.num_seeds
    seed_layers, seed_act = surface.seed_layers, surface.activation
    assert seed_layers is not None and seed_act is not None  # a seed-axis surface that is bounded
    weights = [_block_diagonal(w) for w, _ in seed_layers]
    biases = [tf.reshape(b, [-1]) for _, b in seed_layers]
    if spec is not None:  # [S * B, m, k] -> [B, S * m, S * k], block-diagonal per row
        m, k = spec.shape[-2:]
        spec = tf.reshape(spec, [n, -1, m, k])
        spec = tf.reshape(tf.einsum("sbij,st->bsitj", spec, tf.eye(n, dtype=spec.dtype)),
                          [-1, n * m, n * k])
    lb, ub = affine_stack_bounds(weights, biases, seed_act, _side_by_side(lower),
                                 _side_by_side(upper), method=method, C=spec,
                                 lower_only=lower_only)
    return _per_seed(lb, n), None if ub is None else _per_seed(ub, n)


def output_bounds(surface: PolicySurface, obs: tf.Tensor, eps: tf.Tensor | float,
                  method: str = "crown-ibp") -> tuple[tf.Tensor, tf.Tensor]:
    """Element-wise bounds ``(lb, ub)`` ``[B, k]`` float32 of the policy outputs (logits, Gaussian
    means or Q-values) over the ball ``obs ± eps · scale`` (``[S, B, k]`` for ``obs [S, B, d]``
    on a seed-axis surface). Unchecked (runs inside a compiled step); gradients reach the
    network's weights, not the box."""
    return _bounds(surface, obs, eps, method)


def greedy_margin_lower_bounds(surface: PolicySurface, obs: tf.Tensor, eps: tf.Tensor | float,
                               method: str = "crown-ibp", greedy: tf.Tensor | None = None
                               ) -> tuple[tf.Tensor, tf.Tensor]:
    """``(a*, lb)``: the greedy action ``a* [B]`` int32 at ``obs`` (stopped; or ``greedy``) and
    lower bounds ``[B, A − 1]`` of the margins ``out(a*) − out(j)`` (``j ≠ a*`` ascending) over
    the ball, the margin specification merged into the last layer (``[S, B]`` and
    ``[S, B, A − 1]`` on a seed-axis surface). Unchecked; gradients reach the weights."""
    if greedy is None:
        greedy = tf.argmax(tf.stop_gradient(surface.outputs(obs)), axis=-1, output_type=tf.int32)
    spec = margin_spec(tf.reshape(greedy, [-1]), _n_outputs(surface))
    lb, _ = _bounds(surface, obs, eps, method, spec)
    return greedy, lb


def difference_upper_bounds(surface: PolicySurface, obs: tf.Tensor, eps: tf.Tensor | float,
                            method: str = "crown-ibp") -> tf.Tensor:
    """Upper bounds ``[B, A, A]`` of every output difference ``out(j) − out(a)`` (at ``[a, j]``;
    the diagonal is 0) over the ball ``obs ± eps · scale``, each difference merged into the last
    layer (``[S, B, A, A]`` on a seed-axis surface). Unchecked; gradients reach the weights.

    One backward pass of lower bounds for the ``A (A − 1)`` differences ``j ≠ a``:
    ``ub(z_j − z_a) = −lb(z_a − z_j)``, the same numbers as the upper side's pass (each
    relaxation line and product negated exactly), a quarter of the work of both sides of all
    ``A²`` rows."""
    n = _n_outputs(surface)
    pairs = [(a, j) for a in range(n) for j in range(n) if a != j]
    eye = np.eye(n, dtype=np.float32)
    spec = tf.constant(np.stack([eye[a] - eye[j] for a, j in pairs])[None]
                       if pairs else np.zeros([1, 0, n], np.float32))  # row (a, j): e_a - e_j
    rows = tf.reduce_prod(tf.shape(obs)[:-1])
    lb, _ = _bounds(surface, obs, eps, method, tf.tile(spec, [rows, 1, 1]), lower_only=True)
    lead = [surface.num_seeds, -1] if surface.num_seeds is not None else [-1]
    # [a, j] <- -lb of pair (a, j); the diagonal <- the appended zero column
    index = np.full([n, n], len(pairs), np.int32)
    for k, (a, j) in enumerate(pairs):
        index[a, j] = k
    neg = tf.concat([-lb, tf.zeros_like(lb[..., :1])], axis=-1)
    return tf.reshape(tf.gather(neg, index.reshape(-1), axis=-1), lead + [n, n])


@tf.function(reduce_retracing=True)
def _certified_chunk(weights, biases, lower, upper, spec, activation, method):
    lb, _ = affine_stack_bounds(weights, biases, activation, lower, upper, method=method, C=spec)
    return tf.reduce_all(lb > 0.0, axis=-1)


def certified_actions(agent: Any, obs: tf.Tensor | np.ndarray, eps: float,
                      method: str = "crown") -> tf.Tensor:
    """``[B]`` bool: the greedy action at each observation ``obs [B, d]`` provably stays the
    greedy action for every observation within ``eps`` (L∞, in the agent's units; module doc).

    A ``True`` is a proof (up to float32 rounding); a ``False`` is undecided (an attack may or
    may not change the action). ``eps = 0`` certifies every state whose greedy action is unique.
    """
    surface = check_certifiable(agent, method)
    eps = float(_checks.nonnegative(eps, "eps"))
    obs = np.asarray(obs, np.float32)
    if obs.ndim != 2 or obs.shape[1:] != surface.obs_shape or not np.isfinite(obs).all():
        raise ValueError(f"obs must be finite observations of shape [B, "
                         f"{', '.join(map(str, surface.obs_shape))}], got shape {obs.shape}"
                         f"{'' if np.isfinite(obs).all() else ' holding NaN or inf'}")
    weights, biases, act = _stack(surface)
    n_actions = int(weights[-1].shape[-1])
    out = []
    for start in range(0, len(obs), _CHUNK):
        chunk = tf.constant(obs[start:start + _CHUNK])
        greedy = tf.argmax(surface.outputs(chunk), axis=-1, output_type=tf.int32)
        lower, upper = _network_box(surface, chunk, eps)
        out.append(_certified_chunk(weights, biases, lower, upper, margin_spec(greedy, n_actions),
                                    act, method))
    return tf.concat(out, 0) if out else tf.zeros([0], tf.bool)


def certified_fraction(agent: Any, obs: tf.Tensor | np.ndarray, eps: float,
                       method: str = "crown") -> float:
    """The fraction of the states ``obs [B, d]`` whose greedy action is certified within ``eps``
    (:func:`certified_actions`); ``nan`` for no states."""
    cert = certified_actions(agent, obs, eps, method).numpy()
    return float(cert.mean()) if cert.size else float("nan")


def certified_rows(agent: Any, states: tf.Tensor | np.ndarray, eps: Sequence[float],
                   method: str = "crown") -> list[dict]:
    """One row per budget: ``{"eps", "method", "certified_fraction", "n_states"}`` of the greedy
    actions at ``states [N, d]`` certified within each ``eps`` (:func:`certified_actions`)."""
    return [{"eps": float(e), "method": method, "n_states": int(len(states)),
             "certified_fraction": certified_fraction(agent, states, e, method)} for e in eps]


def certify_agent(agent: Any, eps: float | Sequence[float] = (0.05, 0.1, 0.2),
                  method: str = "crown", n_episodes: int = 20, seed: int = 0,
                  num_envs: int | None = None) -> list[dict]:
    """Certified actions along the agent's own clean episodes: ``n_episodes`` episodes of its
    deterministic policy on fresh envs (``seed``; the states :func:`agents.evaluate_under_attack`
    visits in its clean run), then :func:`certified_rows` of every visited state per budget.

    >>> import agents
    >>> dqn = agents.DQN(env="CartPole-v1", seed=0, preset=None, hidden_sizes=(16,))
    >>> row, = certify_agent(dqn, [0.01], n_episodes=2)
    >>> row["method"], row["n_states"] > 0, 0.0 <= row["certified_fraction"] <= 1.0
    ('crown', True, True)
    """
    check_certifiable(agent, method)
    budgets = sorted({float(_checks.nonnegative(e, "eps")) for e in np.atleast_1d(eps).tolist()})
    n_episodes = _checks.positive_int(n_episodes, "n_episodes")
    seed = _checks.positive_int(seed, "seed", minimum=0)
    k = _checks.positive_int(min(n_episodes, 8) if num_envs is None else num_envs, "num_envs")
    run = _run_episodes(agent, n_episodes, k, seed, record_states=True)
    return certified_rows(agent, run["states"], budgets, method)
