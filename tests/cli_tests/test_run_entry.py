"""Commands only parse flags (issue 34): no function of ``robustgrad/cli.py`` or
``robustgrad/commands/`` is over 60 lines, and ``train-classifier`` is
:func:`attacks.training.train_classifier` over an :class:`attacks.training.ClassifierConfig`
(the command's pre-TensorFlow copies of the library's tables agree with it)."""

import ast
import json
import os
import pathlib

import pytest

from robustgrad import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_LINES = 60


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function (nested ones too) longer than ``limit`` lines,
    decorators and docstring included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = node.end_lineno - first + 1
            if lines > limit:
                out.append((node.name, lines))
    return out


def test_the_counter_sees_a_function_one_line_too_long():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 1))
    assert long_functions("def f():\n" + body) == []
    assert long_functions("def f():\n" + body + "    return x0\n") == [("f", MAX_LINES + 1)]
    nested = "class C:\n    def m(self):\n" + "".join(f"        y{i} = {i}\n" for i in range(61))
    assert long_functions(nested) == [("m", 62)]


def test_no_command_function_is_over_60_lines():
    files = [ROOT / "robustgrad" / "cli.py", *sorted((ROOT / "robustgrad" / "commands")
                                                      .glob("*.py"))]
    assert len(files) > 10
    found = {f"{path.relative_to(ROOT)}:{name}": n for path in files
             for name, n in long_functions(path.read_text())}
    assert found == {}, f"functions over {MAX_LINES} lines (split them by step): {found}"


def test_the_command_s_tables_are_the_library_s():
    from attacks import training
    from attacks.training import config, run
    from robustgrad.commands import _train_classifier_flags as flags
    from robustgrad.commands import train_classifier

    assert train_classifier.ARTIFACTS == run.ARTIFACTS
    assert set(train_classifier._RESUME_FREE) == set(config.RESUME_FREE)
    assert flags.METHODS == config.METHODS == training.METHODS
    assert flags.CERTIFIED == config.CERTIFIED
    assert flags.DEFAULT_WIDTH == config.DEFAULT_WIDTH
    # every flag that is a setting is a config field, with the same default
    parser = cli.build_parser("train-classifier")
    args = parser.parse_args(["train-classifier", "--out", "x"])
    record = config.ClassifierConfig().to_record()
    run_keys = {"out", "overwrite", "resume", "override", "export", "verbose", "no_progress",
                "command", "show_native_log", "threads"}
    assert set(vars(args)) - run_keys - {k for k in vars(args) if k.startswith("_")} == \
        set(record)
    for key in record:
        if key not in ("norm", "width"):  # filled by the config (the flags: by check_values)
            assert getattr(args, key) == record[key], key


def test_recipes_are_keyed_by_config_fields_and_old_spellings_load(tmp_path, monkeypatch):
    from attacks.training import config, recipes

    fields = {f for f in config.ClassifierConfig.__dataclass_fields__}
    assert set(recipes.SETTING_KEYS) <= fields
    with open(recipes._PATH) as f:
        table = json.load(f)
    # a recipes.json that spells settings as flags (--step-size) reads them as fields
    table["recipes"][0]["settings"] = {"--eps": 0.2, "step-size": 0.05, "batch_size": 32}
    path = tmp_path / "recipes.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(recipes, "_PATH", str(path))
    monkeypatch.setattr(recipes, "_TABLE", None)
    name = table["recipes"][0]["name"]
    cfg = config.ClassifierConfig(method=table["recipes"][0]["method"], recipe=name).resolve()
    assert (cfg.eps, cfg.step_size, cfg.batch_size) == (0.2, 0.05, 32)
    assert cfg.origin["step_size"] == "recipe" and cfg.recipe_name == name
    table["recipes"][0]["settings"] = {"--eps-max": 0.2}
    path.write_text(json.dumps(table))
    monkeypatch.setattr(recipes, "_TABLE", None)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['eps_max'\]"):
        recipes.list_recipes()


def test_the_config_resolves_with_provenance_and_refuses_bad_values():
    from attacks.training import ClassifierConfig
    from robustgrad.errors import ConfigError

    cfg = ClassifierConfig(method="fast", data="mnist", epochs=3, lr=0.01).resolve()
    assert (cfg.eps, cfg.epochs, cfg.lr, cfg.batch_size) == (0.3, 3, 0.01, 100)
    assert {k: cfg.origin[k] for k in ("eps", "epochs", "lr", "momentum")} == \
        {"eps": "recipe", "epochs": "user", "lr": "user", "momentum": "default"}
    assert ClassifierConfig(method="fast", recipe="none").resolve().eps == 0.1
    assert ClassifierConfig(method="smoothadv").norm == "l2"
    with pytest.raises(ConfigError, match="method must be one of"):
        ClassifierConfig(method="pgd")
    with pytest.raises(ConfigError, match="batch_size"):
        ClassifierConfig(batch_size=0)
    with pytest.raises(ConfigError, match="--recipe: recipe 'rice2020-pgd-cifar10' is for "
                                          "method 'madry'"):
        ClassifierConfig(method="fast", recipe="rice2020-pgd-cifar10").resolve()
    assert ClassifierConfig(method="clean", steps=0).steps == 0   # recorded by clean runs
    with pytest.raises(ConfigError, match=r"not resolved \(eps, beta, epochs"):
        ClassifierConfig(method="madry").resolved_view()
    assert ClassifierConfig(method="madry").resolve().resolved_view().epochs == 40
    # a resumed run keeps what it resolved (inherit), the given fields win
    saved = {"method": "fast", "eps": None, "resolved": {"values": {"eps": 0.2, "lr": 0.004}}}
    kept = ClassifierConfig(method="fast", lr=0.02).inherit(saved).resolve(saved)
    assert (kept.eps, kept.lr) == (0.2, 0.02)


def test_the_old_run_record_is_a_config(tmp_path):
    """A ``config.json`` written by ba70c33 reads as a config and resolves as it did."""
    from attacks.training import ClassifierConfig

    here = os.path.join(os.path.dirname(__file__), "data", "classifier_run_ba70c33")
    with open(os.path.join(here, "config.json")) as f:
        record = json.load(f)
    cfg = ClassifierConfig.from_record(record).resolve(record)
    assert (cfg.method, cfg.eps, cfg.epochs, cfg.lr, cfg.optimizer) == \
        ("madry", 0.1, 1, 0.001, "adam")
    again = ClassifierConfig.from_record(cfg.to_record())
    assert again.to_record() == cfg.to_record()
