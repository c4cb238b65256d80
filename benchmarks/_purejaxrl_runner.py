"""Run PureJaxRL's ``ppo.py`` (a scratch copy, its own virtualenv) and print one ``RESULT`` line.

Not part of the library and never imported by it: ``benchmarks/rl_vs_jax.py`` starts this file
with the JAX virtualenv's interpreter, ``--purejaxrl DIR`` pointing at a directory that holds
PureJaxRL's ``ppo.py`` and ``wrappers.py`` (read-only copies of github.com/luchris429/purejaxrl;
nothing of it is vendored here). ``make_train(config)`` is PureJaxRL's own; this file only sets
the config, compiles (timed on its own), runs, and reads the episode returns it logs::

    /work/venvs/jax/bin/python benchmarks/_purejaxrl_runner.py --purejaxrl /work/scratch/purejaxrl \
        --steps 200000 --seeds 1

``--seeds S > 1`` vmaps ``train`` over ``S`` keys, as PureJaxRL's README does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _config(steps: int) -> dict:
    """PureJaxRL's CartPole-v1 settings (its ``__main__``), with ``steps`` and no debug prints."""
    return {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": steps,
            "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95,
            "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5,
            "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}


def _stub_unused_imports() -> None:
    """``wrappers.py`` imports brax and navix for its Brax/Navix wrappers, which CartPole does not
    use: empty stand-in modules (only when the real ones are missing) spare installing them."""
    import importlib.util
    import types

    missing = {top for top in ("brax", "navix") if importlib.util.find_spec(top) is None}
    for name, attrs in (("brax", {}), ("brax.envs", {}), ("brax.envs.wrappers", {}),
                        ("brax.envs.wrappers.training",
                         {"EpisodeWrapper": object, "AutoResetWrapper": object}),
                        ("navix", {})):
        if name.split(".")[0] not in missing:
            continue
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    for name in ("brax.envs.wrappers.training", "brax.envs.wrappers", "brax.envs"):
        parent, _, child = name.rpartition(".")
        if name in sys.modules and parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[name])


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--purejaxrl", required=True, help="directory holding ppo.py and wrappers.py")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--seed", type=int, default=30, help="PureJaxRL's own default key")
    args = p.parse_args(argv)
    sys.path.insert(0, args.purejaxrl)
    _stub_unused_imports()
    import jax
    import numpy as np
    from ppo import make_train  # PureJaxRL's, from the scratch copy

    config = _config(args.steps)
    train = make_train(config)
    rng = jax.random.PRNGKey(args.seed)
    if args.seeds > 1:
        rng = jax.random.split(rng, args.seeds)
        train = jax.vmap(train)
    wall0, cpu0 = _clock()
    compiled = jax.jit(train).lower(rng).compile()
    wall1, cpu1 = _clock()
    out = compiled(rng)
    jax.block_until_ready(out)
    wall2, cpu2 = _clock()
    info = out["metrics"]
    # the last iteration's logged returns: each env's latest finished episode, per seed
    last = np.asarray(info["returned_episode_returns"])[..., -1, :, :]
    per_seed = last.reshape(args.seeds, -1).mean(axis=1)
    steps = int(config["NUM_UPDATES"]) * config["NUM_STEPS"] * config["NUM_ENVS"] * args.seeds
    print("RESULT " + json.dumps({
        "side": "purejaxrl", "seeds": args.seeds, "env_steps": steps,
        "compile_wall_s": wall1 - wall0, "compile_cpu_s": cpu1 - cpu0,
        "run_wall_s": wall2 - wall1, "run_cpu_s": cpu2 - cpu1,
        "final_returns": [float(r) for r in per_seed],
        "versions": {"jax": jax.__version__}}), flush=True)


if __name__ == "__main__":
    main()
