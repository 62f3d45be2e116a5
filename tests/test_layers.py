"""Layers only point down: the import contracts in pyproject.toml hold, and docs/architecture.md states the same order.

The contracts (``[tool.importlinter]``) are checked by import-linter's own command over
the source tree, so a failure lists every import that breaks them, with its line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def test_no_package_imports_a_package_above_it() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")  # the venv's console script
    result = subprocess.run([str(lint_imports), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, check=False)
    report = result.stdout + result.stderr
    assert result.returncode == 0, "imports break the contracts in pyproject.toml:\n" + report[max(report.find("Broken contracts"), 0):]
    assert f"{len(_contracts())} kept, 0 broken" in report, report


def test_the_package_map_states_the_enforced_layer_order() -> None:
    bottom_up = " → ".join(reversed(_contracts()["layers"]["layers"]))
    assert bottom_up in (ROOT / "docs" / "architecture.md").read_text(), f"the package map should state: {bottom_up}"
