"""Gradient-based meta-learning: MAML (second order), first-order MAML and Reptile.

The learner is *functional*: its parameters are a flat list of tensors and a function
``apply(params, x) -> predictions`` evaluates it, so the inner loop can produce "fast weights"
(plain tensors) that stay differentiable with respect to the meta-parameters. A
:class:`FunctionalModel` bundles ``apply`` with its ``tf.Variable`` meta-parameters; :func:`mlp`
builds one, :func:`from_keras` wraps a Keras 3 model (through ``model.stateless_call``).

Algorithms (all in :class:`MetaLearner`, chosen with ``method``):

* ``"maml"`` -- Finn, Abbeel & Levine, *Model-Agnostic Meta-Learning for Fast Adaptation of Deep
  Networks*, ICML 2017. The outer gradient flows through the inner SGD steps (second order: the
  inner gradient is taken under an outer ``tf.GradientTape``, so Hessian-vector products appear
  in the meta-gradient).
* ``"fomaml"`` -- the first-order approximation from the same paper: inner gradients are wrapped in
  ``tf.stop_gradient``; the meta-gradient is the query gradient at the adapted parameters.
* ``"reptile"`` -- Nichol, Achiam & Schulman, *On First-Order Meta-Learning Algorithms*, 2018: the
  meta-"gradient" is ``params - adapted_params`` averaged over tasks.

The inner loop is a ``tf.range`` loop (a ``tf.while_loop``) inside one ``tf.function`` per
method; the graph does not grow with the number of inner steps or tasks, and it is traced once per
input signature. The tasks of a meta-batch are adapted together when the model provides a
``batched_apply`` (parameters with a leading task axis, as :func:`mlp` does) and the loss is MSE;
otherwise they are visited by a second ``tf.range`` loop.

Tasks: :class:`SinusoidTasks` is the few-shot regression benchmark of the MAML paper
(amplitude ~ U[0.1, 5], phase ~ U[0, pi], x ~ U[-5, 5], K support points per task).

Modules: ``_models`` (:class:`FunctionalModel`, :func:`mlp`, :func:`from_keras`), ``_tasks``
(:class:`Tasks`, :class:`SinusoidTasks`, :func:`split_tasks`), ``_adapt`` (the inner SGD loop as
functions, shared by the learner and :func:`finetune_mse`) and ``_learner`` (:class:`MetaLearner`,
:func:`maml`, :func:`first_order_maml`, :func:`reptile`, :func:`pretrain`, :func:`finetune_mse`).
Import from this package.

Example::

    >>> import robustgrad.meta as meta
    >>> tasks = meta.SinusoidTasks(k_shot=10, seed=0)
    >>> model = meta.mlp([1, 40, 40, 1], seed=0)
    >>> learner = meta.MetaLearner(model, method="maml", inner_lr=0.01, inner_steps=1)
    >>> history = learner.fit(tasks, iterations=20, meta_batch_size=4)
    >>> batch = tasks.sample(8)
    >>> mse = learner.evaluate(batch, steps=1)          # query MSE after one adaptation step
    >>> float(mse) > 0
    True
"""

from robustgrad.meta._learner import (
    METHODS,
    MetaLearner,
    finetune_mse,
    first_order_maml,
    maml,
    pretrain,
    reptile,
)
from robustgrad.meta._models import FunctionalModel, from_keras, mlp
from robustgrad.meta._tasks import SinusoidTasks, Tasks, split_tasks

__all__ = [
    "METHODS",
    "FunctionalModel",
    "mlp",
    "from_keras",
    "Tasks",
    "SinusoidTasks",
    "split_tasks",
    "MetaLearner",
    "maml",
    "first_order_maml",
    "reptile",
    "pretrain",
    "finetune_mse",
]
