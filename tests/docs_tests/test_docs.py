"""The documentation: every public name has a docstring, every public module is in the API
reference, the guides' code is tested, and the site builds offline with warnings as errors."""

import doctest
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ["robustgrad", "robustgrad.transforms", "robustgrad.meta", "robustgrad.hyper",
            "attacks", "attacks.training", "agents", "agents.graph_envs"]


def exported(package: str):
    """(name, object) for each public name of ``package``: its ``__all__``, else its public
    attributes; submodules left out (they are checked as modules)."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    for name in names:
        obj = getattr(module, name)
        if not isinstance(obj, types.ModuleType):
            yield name, obj


def own_docstring(obj) -> str:
    """The object's own docstring (a class's, not inherited; not a dataclass's made-up one)."""
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    doc = (doc or "").strip()
    if inspect.isclass(obj) and doc.startswith(obj.__name__ + "("):   # dataclass default
        return ""
    return doc


def test_every_public_name_has_a_docstring():
    missing = [f"{package}.{name}" for package in PACKAGES for name, obj in exported(package)
               if (inspect.isclass(obj) or callable(obj)) and not own_docstring(obj)]
    assert not missing, f"public names without a docstring: {missing}"


def test_the_check_sees_a_missing_docstring():
    def undocumented():
        pass

    class Config:
        pass

    assert own_docstring(undocumented) == "" and own_docstring(Config) == ""
    assert own_docstring(own_docstring).startswith("The object's own docstring")


def public_modules():
    for package in ("robustgrad", "attacks", "agents"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p.startswith("_") for p in parts) or "commands" in parts:
                continue
            yield ".".join(parts)


def test_every_public_module_is_in_the_api_reference():
    pages = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    listed = set(re.findall(r"^::: ([\w.]+)", pages, flags=re.M))
    missing = [m for m in public_modules() if m not in listed]
    assert not missing, f"add a '::: module' block to docs/reference/ for {missing}"
    assert "attacks.pgd" in listed and "attacks._engine" not in set(public_modules())


def guide_pages():
    """The pages with code: the guides and the top-level pages (getting started, what happens
    when..., troubleshooting, design notes)."""
    return sorted((DOCS / "guides").glob("*.md")) + sorted(DOCS.glob("*.md"))


def test_guides_python_blocks_are_examples_or_doctests():
    """A ```python block of a guide is a snippet include of a tested file; any other code is
    a ```pycon doctest, run by the next test."""
    for page in guide_pages():
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
            assert re.fullmatch(r'(--8<-- "[\w/.]+"\n)+', block), f"{page.name}: {block[:200]}"


@pytest.mark.parametrize("page", [str(p.relative_to(DOCS)) for p in guide_pages()])
def test_guide_doctests(page):
    failures, _ = doctest.testfile(str(DOCS / page), module_relative=False, encoding="utf-8",
                                   optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert failures == 0


def test_every_example_is_linked_from_a_guide():
    text = "\n".join(p.read_text() for p in guide_pages())
    for example in (ROOT / "examples").glob("*.py"):
        assert f'--8<-- "examples/{example.name}"' in text, example.name


def test_readme_code_comes_from_the_examples():
    """The README's Python lines are lines of examples/*.py, so they run in tests/test_examples."""
    examples = {line.strip() for p in (ROOT / "examples").glob("*.py")
                for line in p.read_text().splitlines()}
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(blocks) >= 4
    stray = [line for b in blocks for line in b.splitlines()
             if line.strip() and line.strip() not in examples]
    assert not stray, f"README lines not in examples/: {stray}"
    assert len(readme.splitlines()) <= 160


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    assert len(links) >= 10
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_doctest_fences():
    pytest.importorskip("griffe", reason="the docs extra is not installed")
    sys.path.insert(0, str(DOCS / "_ext"))
    from doctest_fences import fence_doctests

    text = "Text.\n>>> f([1])\n[[0.6, 0.4]]\n\nExamples:\n    >>> g()\n    1\n"
    fenced = fence_doctests(text)
    assert fenced.startswith("Text.\n\n```pycon\n>>> f([1])\n[[0.6, 0.4]]\n```\n")
    assert fenced.endswith("Examples:\n    >>> g()\n    1\n")   # griffe's own code section


def test_site_config_needs_no_network():
    lines = (ROOT / "mkdocs.yml").read_text().splitlines()
    config = "\n".join(line.split("#")[0] for line in lines)   # comments may name what is absent
    assert re.search(r"^\s+font: false$", config, flags=re.M)
    assert "social" not in config and "inventories" not in config and "http" not in config


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs not installed (pip install -e '.[docs]')")
def test_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (tmp_path / "site" / "reference" / "attacks.html").read_text()
    assert "projected_gradient_descent" in page and "fonts.googleapis" not in page
    assert not (tmp_path / "site" / "_ext").exists()  # the build's extension is not published


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs not installed (pip install -e '.[docs]')")
def test_site_publishes_pages_not_the_build_extension(monkeypatch):
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    files = {f.src_uri: f for f in get_files(load_config(str(ROOT / "mkdocs.yml")))}
    assert files["_ext/doctest_fences.py"].inclusion.is_excluded()
    assert not files["what-happens-when.md"].inclusion.is_excluded()
