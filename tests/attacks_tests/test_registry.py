"""The attack-name registry: every name, the numbered forms, the errors, and the CLI's lists."""

import pytest

import attacks
from attacks.registry import (
    ATTACK_NAMES,
    ATTACK_PATTERNS,
    ATTACK_TABLE,
    describe_attacks,
    parse_attack,
    parse_attacks,
)

# the defaults each base name stood for before the registry (attacks/evaluate.py, 316289a)
DEFAULTS = {
    "fgsm": (attacks.FGM, {}),
    "fgm": (attacks.FGM, {}),
    "bim": (attacks.BIM, {"steps": 10}),
    "mim": (attacks.MIM, {"steps": 10}),
    "pgd": (attacks.PGD, {"steps": 20}),
    "pgd-cw": (attacks.PGD, {"steps": 20, "objective": "cw"}),
    "pgd-dlr": (attacks.PGD, {"steps": 20, "objective": "dlr"}),
    "apgd-ce": (attacks.APGD, {"objective": "ce", "steps": 100}),
    "apgd-dlr": (attacks.APGD, {"objective": "dlr", "steps": 100}),
    "apgd-t": (attacks.APGD, {"objective": "dlr", "steps": 100, "n_target_classes": 9}),
    "cw": (attacks.CarliniWagnerL2, {"steps": 100, "binary_search_steps": 5}),
    "deepfool": (attacks.DeepFool, {}),
    "fab": (attacks.FAB, {"steps": 100}),
    "fab-t": (attacks.FAB, {"steps": 100, "n_target_classes": 9}),
    "square": (attacks.Square, {"steps": 1000}),
}


def test_every_base_name_builds_its_default_attack():
    assert ATTACK_NAMES == tuple(DEFAULTS) == attacks.ATTACK_NAMES
    for name, (cls, config) in DEFAULTS.items():
        label, attack = parse_attack(name)
        assert label == name
        assert type(attack) is cls and attack.config == config, name
    # a fresh object each time: configuring one does not change the next
    assert parse_attack("pgd")[1] is not parse_attack("pgd")[1]


@pytest.mark.parametrize("spec, label, cls, config", [
    ("pgd40", "pgd40", attacks.PGD, {"steps": 40}),
    ("pgd-40", "pgd-40", attacks.PGD, {"steps": 40}),
    (" PGD40 ", "pgd40", attacks.PGD, {"steps": 40}),
    ("pgd50x5", "pgd50x5", attacks.PGD, {"steps": 50, "restarts": 5}),
    ("pgd-cw30", "pgd-cw30", attacks.PGD, {"steps": 30, "objective": "cw"}),
    ("apgd-ce50", "apgd-ce50", attacks.APGD, {"objective": "ce", "steps": 50}),
    ("apgd-t25x2", "apgd-t25x2", attacks.APGD,
     {"objective": "dlr", "steps": 25, "n_target_classes": 9, "restarts": 2}),
    ("square5000", "square5000", attacks.Square, {"steps": 5000}),
    ("bim7", "bim7", attacks.BIM, {"steps": 7}),
    ("mim3", "mim3", attacks.MIM, {"steps": 3}),
])
def test_numbered_names_set_steps_and_restarts(spec, label, cls, config):
    got_label, attack = parse_attack(spec)
    assert got_label == label
    assert type(attack) is cls and attack.config == config


def test_attack_objects_and_labelled_pairs_pass_through():
    pgd = attacks.PGD(steps=3)
    assert parse_attack(pgd) == ("pgd", pgd)
    assert parse_attack(("mine", pgd)) == ("mine", pgd)


@pytest.mark.parametrize("spec, message", [
    ("nope", "attacks: unknown attack 'nope'; known: fgsm, fgm, bim"),
    ("pgdx", "attacks: unknown attack 'pgdx'"),
    ("nope40", "attacks: unknown attack 'nope40'"),
    ("pgd40x", "attacks: unknown attack 'pgd40x'"),
    ("fgsm10", "attacks: 'fgsm10': fgsm has no step count to set"),
    ("bim10x2", "attacks: 'bim10x2': bim has no restarts to set"),
    ("pgd0", "steps of 'pgd0' must be an int >= 1, got 0"),
    ("pgd10x0", "restarts of 'pgd10x0' must be an int >= 1, got 0"),
])
def test_bad_names_raise_value_errors_that_say_why(spec, message):
    with pytest.raises(ValueError) as info:
        parse_attack(spec)
    assert str(info.value).startswith(message), str(info.value)


def test_non_name_entries_raise_a_type_error_that_is_also_a_value_error():
    for bad in (3, None, ("label", "pgd")):
        with pytest.raises(TypeError, match="each entry must be a name or an attacks.Attack"):
            parse_attack(bad)
        with pytest.raises(ValueError):
            parse_attack(bad)


def test_parse_attacks_reads_the_command_line_form_and_refuses_empty_and_duplicates():
    parsed = parse_attacks("pgd50x5, apgd-ce,apgd-t,,square")  # train-classifier's default
    assert [label for label, _ in parsed] == ["pgd50x5", "apgd-ce", "apgd-t", "square"]
    assert parsed[0][1].config == {"steps": 50, "restarts": 5}
    assert [label for label, _ in parse_attacks("fgsm")] == ["fgsm"]
    pgd = attacks.PGD(steps=2)
    assert parse_attacks(pgd) == [("pgd", pgd)]
    assert parse_attacks([("a", pgd)]) == [("a", pgd)]
    # a tuple is a sequence of specs, as evaluate's default ("fgsm", "pgd", ...) is
    assert [label for label, _ in parse_attacks(("fgsm", pgd))] == ["fgsm", "pgd"]
    with pytest.raises(ValueError, match="attacks: give at least one attack"):
        parse_attacks(" , ")
    with pytest.raises(ValueError, match="attacks: give at least one attack"):
        parse_attacks([])
    with pytest.raises(ValueError, match=r"attacks: duplicate names \['pgd', 'pgd'\]: pgd is "
                                         r"listed twice; list it once$"):
        parse_attacks(["pgd", " PGD"])
    # a name an AutoAttack version also runs: advice a command line can follow (issue 36)
    with pytest.raises(ValueError, match=r"^attacks: duplicate names \[.*\]: apgd-ce is listed "
                                         r"twice \(autoattack-plus runs apgd-ce\); list it once$"):
        parse_attacks("fgsm,pgd,apgd-ce,autoattack-plus")
    with pytest.raises(ValueError, match=r"wrap in \(label, attack\) tuples$"):
        parse_attacks(["pgd", pgd])  # an Attack object: only a label tells them apart


def test_describe_attacks_lists_every_name_and_pattern():
    from attacks.autoattack import AUTOATTACK_VERSIONS

    lines = describe_attacks().splitlines()
    assert len(lines) == len(ATTACK_NAMES) + len(ATTACK_PATTERNS) + len(AUTOATTACK_VERSIONS)
    for name, line in zip(ATTACK_NAMES, lines):
        assert line.split()[0] == name and ATTACK_TABLE[name].description in line
    assert "pgd50x5" in lines[-4] and "square5000" in lines[-5]
    assert [line.split()[0] for line in lines[-3:]] == list(AUTOATTACK_VERSIONS)


def test_make_attack_is_the_same_parser():
    assert attacks.make_attack is parse_attack
    assert attacks.make_attack("pgd40")[1].config == {"steps": 40}
