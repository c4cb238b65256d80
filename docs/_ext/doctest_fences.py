"""A griffe extension for the API reference: doctest blocks become fenced ``pycon`` code.

The project's docstrings carry doctests (``>>> ...`` lines and their expected output) in running
text, in ``Example:`` sections (which griffe renders as an admonition, i.e. as Markdown) and in
Google-style ``Examples:`` sections (which griffe turns into code itself). Outside the last kind,
Markdown would read ``[[0.6, 0.4]]`` as a link reference. This extension fences every doctest block
that is not inside an ``Examples:`` section, before the docstring is parsed.

>>> fence_doctests("Text.\\n>>> 1 + 1\\n2\\n\\nMore.")
'Text.\\n\\n```pycon\\n>>> 1 + 1\\n2\\n```\\n\\nMore.'
"""

from __future__ import annotations

import re

import griffe

_SECTION = re.compile(r"^(\s*)Examples:\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def fence_doctests(text: str) -> str:
    """Return ``text`` with each doctest block outside an ``Examples:`` section fenced."""
    lines = text.split("\n")
    out: list[str] = []
    section_indent = None  # indentation of the current Examples: header, if inside one
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _SECTION.match(line)
        if header:
            section_indent = len(header.group(1))
        elif section_indent is not None and line.strip() and _indent(line) <= section_indent:
            section_indent = None
        if section_indent is None and line.lstrip().startswith(">>>"):
            pad = " " * _indent(line)
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out.extend([pad + "```pycon", *block, pad + "```"])
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence the doctests of every docstring as griffe loads the object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: D102
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
