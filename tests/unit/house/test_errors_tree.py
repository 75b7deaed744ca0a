"""The error tree drawn in ``thalweg.errors``' docstring is the real one.

Every subclass of ``ThalwegError`` defined in the package appears in the drawing exactly
once, under its real parent and (when it lives outside ``thalweg.errors``) in the module
it names; nothing is drawn that does not exist. Every other exception class the package
defines must belong to the documented wire family (``RefusalError``), so a new
``class FooError(Exception)`` fails here until it joins the tree.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass

import pytest

import thalweg
import thalweg.errors
from thalweg.errors import InvariantError, ThalwegError

WIRE_FAMILY = "RefusalError"
LINE = re.compile(
    r"^(?P<indent>(?:[│ ] {3})*)(?:[├└]── )?(?P<name>\w+)(?: \((?P<module>[\w.]+)\))?$"
)


@dataclass(frozen=True)
class Drawn:
    name: str
    parent: str | None
    module: str


def drawn_tree() -> list[Drawn]:
    """The classes of the ``::`` block after "The tree", with their drawn parents."""
    doc = thalweg.errors.__doc__
    assert doc is not None
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    out: list[Drawn] = []
    stack: list[str] = []
    for raw in block.splitlines():
        text = raw[4:]  # the literal block's own indentation
        m = LINE.match(text)
        assert m, f"cannot read the drawing's line {raw!r}"
        depth = len(m["indent"]) // 4 + (0 if text.startswith(m["name"]) else 1)
        assert depth <= len(stack), f"{m['name']} is drawn deeper than its parent"
        del stack[depth:]
        out.append(Drawn(m["name"], stack[-1] if stack else None, m["module"] or "thalweg.errors"))
        stack.append(m["name"])
    return out


def package_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of the ``thalweg`` package."""
    found: dict[str, type[BaseException]] = {}
    modules = [thalweg.__name__] + [
        info.name for info in pkgutil.walk_packages(thalweg.__path__, prefix="thalweg.")
    ]
    for name in modules:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == name
            ):
                found[f"{name}.{value.__qualname__}"] = value
    return list(found.values())


def test_the_drawing_matches_the_classes() -> None:
    drawn = drawn_tree()
    names = [d.name for d in drawn]
    assert names[0] == "ThalwegError"
    assert drawn[0].parent is None
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"drawn more than once: {duplicates}"

    real = {cls.__name__: cls for cls in package_exceptions() if issubclass(cls, ThalwegError)}
    assert sorted(real) == sorted(names), (
        f"not drawn: {sorted(set(real) - set(names))}; "
        f"drawn but not defined: {sorted(set(names) - set(real))}"
    )
    for d in drawn[1:]:
        cls = real[d.name]
        parents = [b.__name__ for b in cls.__bases__ if issubclass(b, ThalwegError)]
        assert parents == [d.parent], f"{d.name} derives from {parents}, drawn under {d.parent}"
        assert cls.__module__ == d.module, f"{d.name} is in {cls.__module__}, drawn in {d.module}"


def test_class_names_in_the_tree_are_unique() -> None:
    tree = [c for c in package_exceptions() if issubclass(c, ThalwegError)]
    names = [c.__name__ for c in tree]
    assert len(names) == len(set(names)), sorted(names)


def test_every_other_exception_is_the_wire_family() -> None:
    def wire(cls: type[BaseException]) -> bool:
        return any(
            b.__name__ == WIRE_FAMILY and b.__module__.startswith("thalweg.") for b in cls.__mro__
        )

    outside = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in package_exceptions()
        if not issubclass(c, ThalwegError) and not wire(c) and c is not InvariantError
    )
    assert not outside, f"exception classes outside ThalwegError: {outside}"


def test_a_broken_invariant_is_an_assertion_no_thalweg_handler_catches() -> None:
    assert issubclass(InvariantError, AssertionError)
    assert not issubclass(InvariantError, ThalwegError)


def test_the_wire_family_stays_out_of_the_tree() -> None:
    wire = [c for c in package_exceptions() if c.__name__ == WIRE_FAMILY]
    assert len(wire) == 1
    assert not issubclass(wire[0], ThalwegError)


@pytest.mark.parametrize(
    "line",
    ["    ThalwegError", "    ├── ConfigError", "    │   └── OwnershipLostError (thalweg.x.y)"],
)
def test_the_line_pattern_reads_the_drawing(line: str) -> None:
    assert LINE.match(line[4:])
