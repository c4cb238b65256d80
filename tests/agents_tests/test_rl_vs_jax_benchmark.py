"""Checks of ``benchmarks/rl_vs_jax.py`` (issue 22, section 2) that need neither JAX nor training:
both sides are configured alike, and the reported rates are the arithmetic the docs state."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("rl_vs_jax")


def test_our_config_is_purejaxrls(bench):
    """Every PureJaxRL setting the runner passes has the same value in our config."""
    ref = load_benchmark("_purejaxrl_runner")._config(200_000)
    ours = bench.ppo_config("graph")
    pairs = {"LR": ours.learning_rate, "NUM_ENVS": ours.num_envs, "NUM_STEPS": ours.n_steps,
             "UPDATE_EPOCHS": ours.n_epochs, "NUM_MINIBATCHES": ours.n_minibatches,
             "GAMMA": ours.gamma, "GAE_LAMBDA": ours.gae_lambda, "CLIP_EPS": ours.clip_coef,
             "ENT_COEF": ours.ent_coef, "VF_COEF": ours.vf_coef,
             "MAX_GRAD_NORM": ours.max_grad_norm, "ACTIVATION": ours.activation,
             "ENV_NAME": ours.env, "ANNEAL_LR": ours.anneal_lr}
    assert {k: ref[k] for k in pairs} == pairs
    assert ours.hidden_sizes == (64, 64) and ours.jit_compile and ours.backend == "graph"
    assert not ours.normalize_obs and not ours.normalize_reward and ours.normalize_advantages


def test_rates_separate_and_include_the_compile(bench):
    row = {"env_steps": 1000, "all_env_steps": 1500, "compile_wall_s": 4.0, "compile_cpu_s": 2.0,
           "run_wall_s": 1.0, "run_cpu_s": 0.5, "final_returns": [500.0, 400.0], "seeds": 2}
    r = bench.rates(row)
    assert r["per_cpu_s"] == 2000.0 and r["per_wall_s"] == 1000.0
    assert r["with_compile_per_cpu_s"] == 600.0 and r["with_compile_per_wall_s"] == 300.0
    assert r["mean_return"] == 450.0 and r["seeds_at_goal"] == 1


def test_median_round_is_a_real_round(bench):
    rows = [{"env_steps": n, "run_cpu_s": 1.0, "run_wall_s": 1.0, "compile_cpu_s": 0.0,
             "compile_wall_s": 0.0, "final_returns": [0.0], "tag": n} for n in (30, 10, 20)]
    assert bench._median_rows(rows)["tag"] == 20
