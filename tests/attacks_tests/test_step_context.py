"""The public step context and the method registry: a method written against the context
alone trains, registration is checked, and the built-in methods use no private member."""

import ast
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from attacks import training
from attacks.training import StepContext, StepOutputs, TrainingMethod
from attacks.training.methods import pgd_on_cross_entropy
from robustgrad.errors import ConfigError


class LogitPairing(TrainingMethod):
    """Adversarial logit pairing (Kannan et al. 2018) through the public context only:
    ``CE(f(x'), y) + 0.5 * mean((f(x') - f(x))^2)``, ``x'`` by PGD on the cross-entropy."""

    name = "test-logit-pairing"
    default_steps = 3
    min_steps = 1

    def __init__(self):
        self.contexts = []

    def pair_loss(self, ctx, x, x_adv, y):
        adv, clean = ctx.logits(x_adv, True), ctx.logits(x, True)
        loss = (tf.reduce_mean(ctx.training_ce(adv, y))
                + 0.5 * tf.reduce_mean(tf.square(adv - clean)))
        return loss, adv, clean

    def update(self, ctx, x, y):
        self.contexts.append(ctx)  # at trace time
        variables = ctx.model.trainable_variables
        x_adv = pgd_on_cross_entropy(ctx, x, y, eps=ctx.eps, step_size=ctx.step_size,
                                     steps=ctx.steps, seed=ctx.step_seed())
        (loss, adv, clean), grads = ctx.loss_and_gradients(
            lambda: self.pair_loss(ctx, x, x_adv, y), variables)
        return StepOutputs(loss, ctx.apply_gradients(grads, variables), adv, clean)


@pytest.fixture
def pairing():
    method = training.register_method(LogitPairing())
    try:
        yield method
    finally:
        training.unregister_method(method.name)


def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, 8, 8, 1)).astype("float32")
    y = (x[:, :4].mean((1, 2, 3)) > x[:, 4:].mean((1, 2, 3))).astype("int32")
    return x, y


def _trainer(method, **kw):
    keras.utils.set_random_seed(0)
    clf = training.make_classifier((8, 8, 1), 10, width=4)
    tr = training.AdversarialTrainer(clf, method=method, eps=0.1, seed=5, **kw)
    tr.compile(optimizer=keras.optimizers.SGD(0.05))
    return tr


def test_a_custom_method_written_against_the_context_takes_a_descending_step(pairing):
    tr = _trainer(pairing.name)
    x, y = _data()
    # the step crafts with ctx.step_seed() at step 0: the seed trainer.craft uses by default
    x_adv = tr.craft(x, y)
    ctx = tr.step_context()
    before = float(pairing.pair_loss(ctx, x, x_adv, y)[0])
    logs = tr.train_on_batch(x, y, return_dict=True)
    after = float(pairing.pair_loss(ctx, x, x_adv, y)[0])
    assert logs["loss"] == pytest.approx(before, rel=1e-5)   # the step saw this loss
    assert after < before - 1e-4                             # and one SGD step lowered it
    assert int(tr.step_counter) == 1 and logs["grad_norm"] > 0
    assert pairing.contexts and all(isinstance(c, StepContext) for c in pairing.contexts)
    assert pairing.contexts[-1].model is tr.model


def test_a_custom_method_trains_and_round_trips_by_name(pairing):
    tr = _trainer(pairing.name)
    x, y = _data()
    hist = tr.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False).history["loss"]
    assert hist[-1] < hist[0]
    again = training.AdversarialTrainer.from_config(tr.get_config())
    assert again.method == pairing.name and again.steps == 3


def test_context_values_follow_the_warmup(pairing):
    # a registered method may read every option (a built-in one refuses those it ignores)
    tr = training.AdversarialTrainer(training.make_classifier((8, 8, 1), 10, width=4),
                                     method=pairing.name, eps=0.2, steps=4, warmup_steps=4,
                                     beta=2.0, sigma=0.3)
    tr.step_counter.assign(1)                  # step 2 of a 4-step ramp: half the budget
    ctx = tr.step_context()
    assert float(ctx.eps) == pytest.approx(0.1) and float(ctx.scale) == pytest.approx(0.5)
    assert float(ctx.step_size) == pytest.approx(2.5 * 0.2 / 4 * 0.5)
    assert (ctx.full_eps, ctx.steps, ctx.norm, ctx.beta, ctx.sigma) == (0.2, 4, "linf", 2.0, 0.3)
    assert float(tr.step_context(0.05).eps) == pytest.approx(0.05)
    same, other_salt = ctx.step_seed(), ctx.step_seed(2)
    np.testing.assert_array_equal(same, tr.step_context().step_seed())
    assert not np.array_equal(same, other_salt)
    tr.step_counter.assign(2)
    assert not np.array_equal(same, tr.step_context().step_seed())
    with pytest.raises(AttributeError):
        ctx.norm = "l2"                        # the configuration is read-only


def test_registry_refuses_what_it_cannot_hold(pairing):
    assert training.registered_methods()[-1] == pairing.name
    assert pairing.name not in training.METHODS            # METHODS: the built-ins
    with pytest.raises(TypeError, match="TrainingMethod instance; got str"):
        training.register_method("madry")
    with pytest.raises(ValueError, match="'madry' is a built-in method's"):
        training.register_method(type("M", (TrainingMethod,), {"name": "madry"})())
    with pytest.raises(ValueError, match="non-empty string"):
        training.register_method(TrainingMethod())
    with pytest.raises(ValueError, match="already registered; pass replace=True"):
        training.register_method(LogitPairing())
    replacement = training.register_method(LogitPairing(), replace=True)
    assert training.get_method(pairing.name) is replacement
    with pytest.raises(ValueError, match="built in and cannot be unregistered"):
        training.unregister_method("fast")
    training.unregister_method(pairing.name)
    with pytest.raises(ConfigError, match="method must be one of .*'smoothadv'\\), got"):
        training.get_method(pairing.name)
    with pytest.raises(ValueError, match="no custom method"):
        training.unregister_method(pairing.name)
    training.register_method(pairing)                      # for the fixture's cleanup


def test_method_modules_use_no_private_member_of_the_context_or_trainer():
    root = pathlib.Path(training.__file__).parent
    private = []
    for name in ("methods", "certified", "noise", "smoothadv", "registry"):
        tree = ast.parse((root / f"{name}.py").read_text())
        private += [f"{name}.py:{node.lineno} {node.value.id}.{node.attr}"
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                    and node.value.id in ("ctx", "trainer")]
    assert private == []


# ------------------------------------------------------------------ the trainer's option groups

def test_option_groups_and_flat_keywords_make_the_same_trainer():
    clf = training.make_classifier((8, 8, 1), 10, width=4)
    flat = training.AdversarialTrainer(
        clf, method="trades", eps=0.3, norm="l2", clip_min=-1.0, steps=3, beta=2.0,
        label_smoothing=0.1, max_grad_norm=1.0, weight_decay=5e-4, warmup_steps=7, seed=4,
        name="t")
    grouped = training.AdversarialTrainer(
        clf, method="trades", eps=0.3, seed=4, name="t",
        crafting=training.CraftingOptions(norm="l2", clip_min=-1.0, steps=3),
        loss=training.LossOptions(beta=2.0, label_smoothing=0.1),
        update=training.UpdateOptions(max_grad_norm=1.0, weight_decay=5e-4),
        schedule=training.ScheduleOptions(warmup_steps=7))
    config = flat.get_config()
    assert grouped.get_config() == config
    assert (config["norm"], config["beta"], config["warmup_steps"], config["step_size"]) == \
        ("l2", 2.0, 7, pytest.approx(2.5 * 0.3 / 3))
    # a flat config (every saved trainer's) still loads
    assert training.AdversarialTrainer.from_config(config).get_config() == config


def test_option_groups_refuse_conflicts_and_bad_values():
    clf = training.make_classifier((8, 8, 1), 10, width=4)
    with pytest.raises(TypeError, match="beta given both as keyword"):
        training.AdversarialTrainer(clf, beta=1.0, loss=training.LossOptions(beta=2.0))
    with pytest.raises(TypeError, match="update must be UpdateOptions; got dict"):
        training.AdversarialTrainer(clf, update={"max_grad_norm": 1.0})
    with pytest.raises(ValueError, match="adv_ratio"):
        training.LossOptions(adv_ratio=1.5)
    with pytest.raises(ValueError, match=r"clip_min \(1.0\) must be < clip_max \(0.0\)"):
        training.CraftingOptions(clip_min=1.0, clip_max=0.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        training.AdversarialTrainer(clf, warmup_steps=-1)
    with pytest.raises(ValueError, match="norm 'l1' is not supported by method 'fast'"):
        training.AdversarialTrainer(clf, method="fast", crafting=training.CraftingOptions(
            norm="l1"))
    with pytest.raises(ValueError, match="Unrecognized keyword arguments .*not_an_option"):
        training.AdversarialTrainer(clf, not_an_option=1)   # unknown keywords reach Keras
