"""The public API surface: every public function and every public method of a public class has a
docstring, and in ``attacks`` and ``agents`` every one of them also has type hints for its
parameters and its return.

The walk starts from the public modules that tests/docs_tests/test_docs.py checks (packages and
modules without a leading underscore, the command line's ``commands`` left out) and takes every
public name such a module holds that is defined in our packages, so a class defined in a private
module and re-exported (``attacks.Attack`` from ``attacks/_base.py``) is checked too. Members
inherited from TensorFlow, Keras or gymnasium are not ours and are skipped; a method that overrides
a documented method of one of our own base classes may keep the base's docstring.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_docs import ROOT, public_modules

OURS = ("robustgrad", "attacks", "agents")
HINTED = ("attacks", "agents")          # packages whose public API must carry type hints

# Offenders allowed for now, listed by name; every name here must still be an offender (checked
# below), so the list can only shrink. Empty: every public name is documented and hinted.
_PENDING: set[str] = set()


def _is_ours(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in OURS


def _python_function(obj: Any) -> Callable | None:
    """The plain Python function behind a function, a tf.function or a functools.wraps wrapper."""
    if inspect.isfunction(obj):
        return obj
    inner = getattr(obj, "python_function", None)     # tf.function
    return inner if inspect.isfunction(inner) else None


def public_objects() -> Iterator[tuple[str, Any]]:
    """('module.qualname', object) for every public function and class of our public modules, once
    each, named by the module that defines it: the names in a module's ``__all__`` (re-exports
    included) and the names without a leading underscore that it defines itself, or, without an
    ``__all__``, every name without a leading underscore."""
    seen: set[int] = set()
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        public = [n for n in vars(module) if not n.startswith("_")]
        exported = getattr(module, "__all__", None)
        if exported:
            own = [n for n in public if getattr(vars(module)[n], "__module__", None) == module_name]
            public = list(exported) + [n for n in own if n not in exported]
        for name in public:
            obj = getattr(module, name, None)
            if not (inspect.isclass(obj) or _python_function(obj)) or not _is_ours(obj):
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            yield f"{obj.__module__}.{obj.__qualname__}", obj


def _members(cls: type) -> Iterator[tuple[str, str, Any]]:
    """(name, kind, function) for the methods and properties ``cls`` itself defines; kind is
    'method', 'static', 'class' or 'property'."""
    for name, raw in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(raw, property):
            if raw.fget is not None:
                yield name, "property", raw.fget
        elif isinstance(raw, staticmethod):
            yield name, "static", raw.__func__
        elif isinstance(raw, classmethod):
            yield name, "class", raw.__func__
        elif (function := _python_function(raw)) is not None:
            yield name, "method", function


def _base_docstring(cls: type, name: str) -> str:
    """The docstring of ``name`` on the nearest base class of ours that defines it, else ''."""
    for base in cls.__mro__[1:]:
        if _is_ours(base) and name in vars(base):
            raw = vars(base)[name]
            doc = raw.fget.__doc__ if isinstance(raw, property) else getattr(raw, "__doc__", None)
            if doc and doc.strip():
                return doc
    return ""


def has_docstring(function: Callable, cls: type | None = None, name: str = "") -> bool:
    """Whether ``function`` has its own docstring, or overrides a documented method of ours."""
    if (function.__doc__ or "").strip():
        return True
    return cls is not None and bool(_base_docstring(cls, name).strip())


def missing_hints(function: Callable, kind: str = "function", init: bool = False) -> list[str]:
    """The parameters of ``function`` without an annotation (self/cls and *args/**kwargs exempt),
    and 'return' when the return is not annotated (not asked of ``__init__``)."""
    parameters = list(inspect.signature(function).parameters.values())
    if kind in ("method", "class", "property") and parameters:
        parameters = parameters[1:]
    missing = [p.name for p in parameters
               if p.annotation is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not init and inspect.signature(function).return_annotation \
            is inspect.Signature.empty:
        missing.append("return")
    return missing


def offenders() -> tuple[list[str], list[str]]:
    """('module.qualname' without a docstring, 'module.qualname(missing, ...)' without hints)."""
    undocumented, unhinted = [], []
    for qualname, obj in public_objects():
        hinted = qualname.split(".")[0] in HINTED
        if inspect.isclass(obj):
            for name, kind, function in _members(obj):
                member = f"{qualname}.{name}"
                if name != "__init__" and not has_docstring(function, obj, name):
                    undocumented.append(member)
                if hinted and _is_ours(function):
                    gaps = missing_hints(function, kind, init=name == "__init__")
                    if gaps:
                        unhinted.append(f"{member}({', '.join(gaps)})")
        else:
            function = _python_function(obj)
            if not has_docstring(function):
                undocumented.append(qualname)
            if hinted and (gaps := missing_hints(function)):
                unhinted.append(f"{qualname}({', '.join(gaps)})")
    return undocumented, unhinted


def _name(entry: str) -> str:
    return entry.split("(")[0]


def test_every_public_function_and_method_has_a_docstring():
    undocumented, _ = offenders()
    left = sorted(m for m in undocumented if m not in _PENDING)
    assert not left, f"{len(left)} public functions/methods without a docstring:\n" + "\n".join(left)


def test_every_public_function_and_method_of_attacks_and_agents_has_type_hints():
    _, unhinted = offenders()
    left = sorted(m for m in unhinted if _name(m) not in _PENDING)
    assert not left, (f"{len(left)} public functions/methods without type hints "
                      "(missing parameters/return in parentheses):\n" + "\n".join(left))


def test_pending_names_are_still_offenders():
    """The allow-list only shrinks: a name fixed since is taken off it."""
    undocumented, unhinted = offenders()
    current = set(undocumented) | {_name(m) for m in unhinted}
    fixed = sorted(_PENDING - current)
    assert not fixed, f"fixed since, remove from _PENDING: {fixed}"


def test_the_checks_see_a_missing_docstring_and_missing_hints():
    def bare(x, *args, y=1, **kwargs):
        pass

    def hinted(x: int, *args, y: int = 1, **kwargs) -> int:
        """Documented."""
        return x

    class Base:
        def run(self, x: int) -> int:
            """Run it."""
            return x

    class Child(Base):
        def run(self, x):
            return x

        def extra(self, x: int) -> int:
            return x

    assert not has_docstring(bare) and has_docstring(hinted)
    assert missing_hints(bare) == ["x", "y", "return"] and missing_hints(hinted) == []
    assert missing_hints(Child.run, "method") == ["x", "return"]
    assert missing_hints(Base.run, "method") == []
    assert has_docstring(Child.run, Child, "run") is False   # Base is not one of our packages
    Base.__module__ = Child.__module__ = "agents.example"
    assert has_docstring(Child.run, Child, "run") and not has_docstring(Child.extra, Child, "extra")
    assert [n for n, _, _ in _members(Child)] == ["run", "extra"]


def private_core_names(source: str) -> list[str]:
    """The private ``robustgrad`` modules and names ``source`` imports (``from robustgrad._x import
    y``, ``from robustgrad.x import _y``, ``import robustgrad._x``) or names in a dotted string
    (a Ray set-up hook), each as ``'line: dotted.name'``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "robustgrad":
            found += [f"{node.lineno}: {node.module}.{alias.name}" for alias in node.names
                      if any(p.startswith("_") for p in [*node.module.split("."), alias.name])]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] == "robustgrad"
                      and any(p.startswith("_") for p in alias.name.split("."))]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"{node.lineno}: {m}"
                      for m in re.findall(r"\brobustgrad(?:\.\w+)*\._\w+", node.value)]
    return found


def test_attacks_and_agents_use_only_public_modules_of_the_core():
    found = [f"{path.relative_to(ROOT)}:{hit}" for package in ("attacks", "agents")
             for path in sorted((ROOT / package).rglob("*.py"))
             for hit in private_core_names(path.read_text())]
    assert not found, "private robustgrad modules used from attacks/agents:\n" + "\n".join(found)


def test_the_private_import_scan_sees_every_form():
    source = ("from robustgrad._checks import choice\nfrom robustgrad import _checks, tape\n"
              "import robustgrad.bounds._engine\nfrom robustgrad.tape import _as_source\n"
              "HOOK = 'robustgrad._native_stderr.quiet'\n"
              "from robustgrad.checks import choice\nimport robustgrad.bounds\nfrom . import _x\n")
    assert private_core_names(source) == [
        "1: robustgrad._checks.choice", "2: robustgrad._checks", "3: robustgrad.bounds._engine",
        "4: robustgrad.tape._as_source", "5: robustgrad._native_stderr"]


@pytest.mark.parametrize("package", ["attacks", "agents"])
def test_the_package_all_lists_every_name_its_init_imports(package):
    """``__all__`` of ``attacks`` and ``agents`` is exactly the names their ``__init__`` imports
    (the re-exports), once each and sorted, and every one of them resolves."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    imported = sorted(alias.asname or alias.name for node in tree.body
                      if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names)
    module = importlib.import_module(package)
    assert module.__all__ == imported
    assert all(hasattr(module, name) for name in module.__all__)


def test_the_three_packages_ship_their_type_hints():
    """A ``py.typed`` marker (PEP 561) in each package, listed as package data."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    for package in OURS:
        assert (ROOT / package / "py.typed").is_file(), package
        assert "py.typed" in package_data[package], package
