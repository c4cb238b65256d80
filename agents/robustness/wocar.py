"""WocaR: worst-case-aware robust training without an attacker (``robust="wocar"``).

Liang, Sun, Zheng, Huang, "Efficient Adversarial Training without Attacking: Worst-Case-Aware
Robust Reinforcement Learning", NeurIPS 2022. Instead of training against an attack (SA's inner
search on every update, ATLA's learned adversary), the agent learns what the *worst* attack
within eps would cost it, and optimises for that too. Three pieces, all on the agent's own
rollout (PPO and A2C with a discrete policy; :class:`WocaRPlugin`, with the pieces every variant
shares in :mod:`agents.robustness.wocar_base`; with a Gaussian policy on Box actions,
:class:`WocaRBoxPlugin`, the admissible set a box of the mean's bounds,
:mod:`agents.robustness.wocar_box`; DQN's variant, on the replay, is :class:`WocaRDQNPlugin`,
:mod:`agents.robustness.wocar_dqn`). This module is the method's entry: it re-exports each
public name and registers the ``"wocar"`` plug-in (:func:`agents.core.plugin.register_robustness`),
the variant chosen by the agent (a Q-learner, a discrete or a Box-action actor-critic):

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
   ``q_minibatches`` minibatches of at least ``q_min_rows`` rows where the rollout has them
   (squared error, Adam at ``q_lr``, target rate ``tau``; defaults 4, 4, 1, 1e-3, 0.01; on Box
   actions 10 epochs of 32 minibatches of 8 rows and up; the paper's PPO code: 10 epochs of
   32 minibatches, lr 4e-4, tau 0.001 on 2048-step MuJoCo rollouts).

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
   rollout_regularizer_inputs`); the update differentiates ``pi(.|s_hat)`` through the
   current weights on every other step, the term weighted twice (``smoothness_every``: steps
   ``0, k, 2k, ...`` of each update, weighted so an update's weights sum to its steps; 1 on Box
   actions, where every other step was not tried). SA-PPO and the paper's code search again on
   every minibatch of every epoch (with the CartPole preset's 20 epochs that search was ~70% of
   WocaR's training CPU) and take the term on every step (on CartPole, 20 forward and
   backward passes on ``s_hat`` per rollout were ~45% of what WocaR added to PPO's CPU; every
   other step kept the 200k-step worst case: docs/benchmarks/robust-rl.md).

The cost (CartPole preset, 100k steps, tracing included, 2026-12-04 on the shared 2-core
machine, docs/benchmarks/robust-rl.md): 1.46x vanilla PPO's training CPU (one seed; 1.64x the
median of 3 seeds at load ~2.6) with the search once per rollout, 2.77x with the search per
minibatch; per rollout of 256 steps the worst-attack critic's 16 steps
cost ~8.5 ms, the admissible sets (IBP, 256 states) ~0.9 ms, one 10-step search ~5.4 ms, against
~2 ms for one PPO gradient step. At 200k steps, two seeds, measured side by side on a quiet
machine (2026-12-06): 1.41x vanilla's with the smoothness term on every other update step (the
discrete default), 1.47x with it on every step.

Every setting is a field of the typed config :class:`agents.WocaR` (flat ``wocar_*`` fields of
the agent's config, checked with the others; ``None`` takes :attr:`agents.WocaR.DEFAULTS`):
where the paper's PPO code differs from the defaults here, it is one of them
(``admissible_eps``, ``importance``, ``weight_over_run``, ``search_per_rollout``,
``smoothness_every``, the critic's ``q_epochs``, ``q_minibatches``, ``q_min_rows``, ``q_lr``,
``tau``; screened against Robust Sarsa on CartPole in docs/benchmarks/robust-rl.md).

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

from typing import Any

from agents.core.plugin import RobustnessPlugin, register_robustness
from agents.robustness.wocar_base import (
    WocaRPlugin,
    admissible_actions,
    check_wocar_agent,
    state_importance,
    worst_attack_target,
)
from agents.robustness.wocar_box import WocaRBoxPlugin
from agents.robustness.wocar_dqn import WocaRDQNPlugin, q_scale, worst_case_bound_loss

__all__ = ["WocaRBoxPlugin", "WocaRDQNPlugin", "WocaRPlugin", "admissible_actions",
           "check_wocar_agent", "q_scale", "state_importance", "worst_attack_target", "worst_case_bound_loss"]


def _wocar(agent: Any) -> RobustnessPlugin:
    """The WocaR plug-in of ``agent``: WocaR-DQN for a Q-learner, else the actor-critic's."""
    if getattr(agent, "value_based", False):
        return WocaRDQNPlugin(agent)
    return WocaRPlugin(agent) if agent.discrete else WocaRBoxPlugin(agent)


register_robustness("wocar", _wocar)
