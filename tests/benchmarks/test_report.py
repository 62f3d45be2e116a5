"""The shared benchmark report: a run's section of docs/benchmarks.md is replaced whole, and nothing else is."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parents[2]

INFO = report.RunInfo(command="python benchmarks/toy.py --rows 3", started="2026-11-27 23:00 UTC",
                      machine="Some CPU, 2 cores", load="load average 0.5 at the start, 1.5 at the end")
PAGE = """# Benchmarks

## toy

What toy measures.

<!-- benchmark:toy -->
old run
<!-- /benchmark:toy -->

Notes that stay.

## other

<!-- benchmark:other -->
other's run
<!-- /benchmark:other -->
"""


def test_the_section_names_command_date_machine_and_load_then_every_table() -> None:
    text = report.section("toy", INFO, [("Rows", ["row", "n"], [["a", 1.0], ["b", 12345.0]])])
    assert text.splitlines()[0] == ("**Latest run**: `python benchmarks/toy.py --rows 3`, 2026-11-27 23:00 UTC, "
                                    "on Some CPU, 2 cores; load average 0.5 at the start, 1.5 at the end.")
    assert "| row | n |\n|:---|---:|\n| a | 1 |\n| b | 12,345 |" in text


def test_replacing_a_section_keeps_the_prose_and_the_other_sections() -> None:
    page = report.replace_section(PAGE, "toy", "new run\n")
    assert "<!-- benchmark:toy -->\nnew run\n<!-- /benchmark:toy -->" in page
    assert "old run" not in page
    assert page.replace("new run", "old run") == PAGE  # everything else byte for byte
    assert report.replace_section(page, "toy", "new run") == page  # idempotent


def test_a_benchmark_without_a_section_gets_one_appended_under_its_name() -> None:
    page = report.replace_section(PAGE, "fresh", "first run")
    assert page.startswith(PAGE.rstrip("\n"))
    assert page.endswith("\n## fresh\n\n<!-- benchmark:fresh -->\nfirst run\n<!-- /benchmark:fresh -->\n")


@pytest.mark.parametrize("broken", [
    PAGE.replace("<!-- /benchmark:toy -->", ""),  # begin without end
    PAGE.replace("<!-- benchmark:toy -->", ""),  # end without begin
    PAGE + "<!-- benchmark:toy -->\n<!-- /benchmark:toy -->\n",  # twice
])
def test_broken_markers_are_refused_rather_than_guessed(broken: str) -> None:
    with pytest.raises(ValueError, match="toy"):
        report.replace_section(broken, "toy", "new run")


def test_the_option_takes_a_page_or_prints_the_section() -> None:
    parser = argparse.ArgumentParser()
    report.add_markdown_option(parser)
    assert parser.parse_args([]).markdown is None
    assert parser.parse_args(["--markdown"]).markdown == "-"
    assert parser.parse_args(["--markdown", "docs/benchmarks.md"]).markdown == "docs/benchmarks.md"
    report._target.clear()


def test_machine_names_a_model_and_the_cores() -> None:
    model, cores = report.machine().rsplit(", ", 1)
    assert model and cores.endswith(" cores") and int(cores.split()[0]) >= 1


TOY = """
import argparse
from benchmarks.report import add_markdown_option, markdown_run, table

def main() -> None:
    parser = argparse.ArgumentParser()
    add_markdown_option(parser)
    parser.parse_args()
    table("Rows", ["row", "n"], [["a", 1]])

if __name__ == "__main__":
    with markdown_run():
        main()
"""


def test_a_benchmark_run_with_markdown_rewrites_its_own_section(tmp_path: Path) -> None:
    (tmp_path / "toy.py").write_text(TOY)
    page = tmp_path / "benchmarks.md"
    page.write_text(PAGE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(tmp_path / "toy.py"), "--markdown", str(page)], env=env, check=True,
                   capture_output=True, timeout=60)
    text = page.read_text()
    assert "old run" not in text and "other's run" in text and "Notes that stay." in text
    assert f"`python benchmarks/toy.py --markdown {page}`" in text and "| a | 1 |" in text
    printed = subprocess.run([sys.executable, str(tmp_path / "toy.py"), "--markdown"], env=env, check=True,
                             capture_output=True, text=True, timeout=60).stdout
    assert "<!-- benchmark:toy -->\n**Latest run**" in printed and page.read_text() == text
