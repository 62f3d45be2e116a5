"""Every package production code imports is a declared runtime dependency ([project].dependencies).

A package that comes only through another's dependencies, or only with the dev extra, works in the test venv
and is missing (or changes under us) in a production install: subscriptions.vault once imported cryptography,
which only the dev extra brought. tests/test_production_install.py proves the install starts; this says which
import is undeclared, in a second, in every run.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The packages a production install ships ([tool.setuptools.packages.find]).
PRODUCTION = [p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]


def imported_modules(source: str) -> Iterator[str]:
    """The top-level module of every absolute import in ``source`` (lazy ones inside functions too)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.partition(".")[0]


def third_party_imports() -> dict[str, list[str]]:
    """Each third-party top-level module production code imports: the files importing it."""
    found: dict[str, list[str]] = {}
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module in imported_modules(path.read_text()):
                if module not in sys.stdlib_module_names and module not in PRODUCTION and module != "__future__":
                    found.setdefault(module, []).append(str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}


def test_the_import_scan_sees_lazy_and_dotted_imports() -> None:
    source = "import a.b\nfrom c.d import e\nfrom . import f\ndef g():\n    import h\n"
    assert list(imported_modules(source)) == ["a", "c", "h"]


def test_every_imported_package_is_a_declared_dependency() -> None:
    distributions = importlib.metadata.packages_distributions()
    runtime = declared()
    missing = {}
    for module, files in third_party_imports().items():
        providers = {canonicalize_name(d) for d in distributions.get(module, [])}
        assert providers, f"{module} (imported by {files[0]}) is provided by no installed distribution"
        if not providers & runtime:
            missing[module] = (sorted(providers), files[:3])
    assert not missing, f"imported by production code, not in [project].dependencies: {missing}"


def test_benchmark_peers_stay_out_of_the_test_venv() -> None:
    """quixstreams pins pydantic and pydantic-settings below what production resolves: only the bench extra has it,
    never the runtime dependencies or the dev extra the test venv installs."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    bench = {canonicalize_name(Requirement(r).name) for r in extras["bench"]}
    assert "quixstreams" in bench
    dev = {canonicalize_name(Requirement(r).name) for r in extras["dev"]}
    assert not bench & (dev | declared())
