"""Structure rules of DEVELOPERS.md that import-linter cannot check, run by ``make lint``:

- sizes: no module of the product (``core``, ``airflow_plugin``, ``prefect_integration``) over
  800 lines and no class over 400, so that a newcomer reads a module in one sitting;
- the import-linter contract that keeps the adapters and the CLI on core's faces lists every
  package and private leaf module of core (its wildcards match whole module names only, so
  ``core._*`` cannot be written), and the layers contract puts each on a floor: a new
  ``core/_x.py`` or ``core/x/`` missing from them fails here.

The units that were over the limits when this check came are listed in ``CEILINGS`` with their
size then: each may shrink, never grow, and leaves the list once it is under the limit (the check
says so when a ceiling is no longer needed). Any other module or class over a limit fails.

Usage: python .ci/check_structure.py [ROOT]   (exit 1 with one line per problem)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tomllib

MODULE_LINES = 800
CLASS_LINES = 400

PRODUCT = ("core", "airflow_plugin", "prefect_integration")
"""The product's packages, whose modules and classes the sizes cover."""

CEILINGS: dict[str, int] = {
    # module path or "path::Class" -> its size in lines when the check came; only ever lowered
}


def sizes(root: Path) -> dict[str, int]:
    """Lines of every module of the product (``PRODUCT`` under ``root``) and of every class in
    them (a class: from its ``class`` line, decorators aside, to its last line)."""
    out: dict[str, int] = {}
    for path in sorted(p for d in PRODUCT for p in (root / d).rglob("*.py")):
        name = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        out[name] = text.count("\n") + (not text.endswith("\n") and bool(text))
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                out[f"{name}::{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def problems(found: dict[str, int]) -> tuple[list[str], list[str]]:
    """(failures, notes): units over their bound, and ceilings no longer needed."""
    failures: list[str] = []
    notes: list[str] = []
    for unit, lines in found.items():
        limit = CLASS_LINES if "::" in unit else MODULE_LINES
        ceiling = CEILINGS.get(unit)
        if lines <= limit:
            if ceiling is not None:
                notes.append(f"{unit}: {lines} lines, under the limit of {limit}: drop its ceiling")
            continue
        if ceiling is None:
            failures.append(f"{unit}: {lines} lines, over the limit of {limit}: split it")
        elif lines > ceiling:
            failures.append(
                f"{unit}: {lines} lines, more than its ceiling of {ceiling} (the limit is "
                f"{limit}): it may only shrink"
            )
        elif lines < ceiling:
            notes.append(f"{unit}: {lines} lines, below its ceiling of {ceiling}: lower it")
    for unit in CEILINGS:
        if unit not in found:
            notes.append(f"{unit}: gone: drop its ceiling")
    return failures, notes


FACE_CONTRACT_SOURCES = {"airflow_plugin", "prefect_integration", "core.cli"}


def face_problems(root: Path) -> list[str]:
    """The private modules and packages of core (``core/_*.py``, ``core/_*/__init__.py``)
    missing from the import-linter contract whose sources are the adapters and the CLI, and
    listed ones that no longer exist."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    [face] = [c for c in contracts if set(c.get("source_modules", ())) == FACE_CONTRACT_SOURCES]
    listed = set(face["forbidden_modules"])
    private = {f"core.{p.stem}" for p in (root / "core").glob("_*.py") if p.stem != "__init__"}
    packages = {f"core.{p.parent.name}" for p in (root / "core").glob("*/__init__.py")}
    private |= packages - {"core.cli"}
    faces = {f"core.{p.stem}" for p in (root / "core").glob("[a-z]*.py")}  # core.local
    out = [f"pyproject.toml: {m} is not in the face contract's forbidden_modules: add it"
           for m in sorted(private - listed)]  # fmt: skip
    out += [f"pyproject.toml: the face contract lists {m}, which does not exist: drop it"
            for m in sorted(listed - private)]  # fmt: skip
    [layers] = [c for c in contracts if c.get("type") == "layers"]
    floors = {f"core.{m.strip()}" for layer in layers["layers"] for m in layer.split("|")}
    out += [f"pyproject.toml: {m} is on no floor of the layers contract: put it on one"
            for m in sorted((private | packages | faces) - floors)]  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = sizes(root)
    failures, notes = problems(found)
    failures += face_problems(root)
    for line in notes:
        print(f"check_structure: note: {line}")
    for line in failures:
        print(f"check_structure: {line}", file=sys.stderr)
    if not failures:
        largest = max(((u, n) for u, n in found.items() if "::" not in u), key=lambda item: item[1])
        print(f"check_structure: ok (largest module {largest[0]}, {largest[1]} lines)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
