"""The configuration reference, docs/configuration.md, generated from :class:`core.settings.Settings`.

The page lists every setting (environment variable, type, default, description) in the order and under the
``# --- area ---`` comments of ``core/settings.py``, so it cannot drift from the code: a test compares it with
what this module generates.

    python -m core.settings_doc           # print the page
    python -m core.settings_doc --write   # rewrite docs/configuration.md
"""

from __future__ import annotations

import ast
import json
import re
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from core import cli
from core import settings as settings_module
from core.settings import Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
COMMAND = "python -m core.settings_doc --write"
SECTION = re.compile(r"^\s*# --- (.+?) -*$")

HEADER = f"""# Configuration

<!-- Generated from core/settings.py by `{COMMAND}`; edit the settings (their descriptions), not this page. -->

Everything is read by one settings object, `Settings` in `core/settings.py` (pydantic-settings), from `TOCSIN_*`
environment variables or a `.env` file in the working directory. The local runner (`infra/up`), the tests and
`docker-compose.yml` configure the same code the same way, and a process passes its settings to the processes it
starts (`Settings.to_env`). Values are parsed as pydantic parses them: numbers and booleans (`true`/`false`) as
text, lists and objects as JSON (`TOCSIN_WEBHOOK_ALLOW_HOSTS='["127.0.0.1"]'`), and `null` unsets a setting whose type
admits none (`TOCSIN_SINK_BATCH_TRANSITIONS=null`). An invalid value stops the process
at start-up with the setting's name and what is wrong. Where a setting's behaviour needs more than a line, the
description names the page that explains it ([docs/](.)).

Three variables are read outside `Settings`: `TOCSIN_LOG_LEVEL` (one level for Tocsin's and third-party loggers:
[operations.md](operations.md#logs)), and the test suite's
`TOCSIN_TEST_POSTGRES_URL` and `TOCSIN_TEST_WORKERS` ([development.md](development.md)).
"""


class MissingDescription(ValueError):
    """A setting without a description: the reference would have a blank line for it."""


def areas() -> list[tuple[str, list[str]]]:
    """The settings' names grouped by the ``# --- area ---`` comment above them in core/settings.py, in order."""
    source = Path(settings_module.__file__).read_text()
    lines = source.splitlines()
    [cls] = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Settings"]
    groups: list[tuple[str, list[str]]] = [("General", [])]
    previous_end = cls.lineno
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id != "model_config":
            for line in lines[previous_end:node.lineno - 1]:
                match = SECTION.match(line)
                if match:
                    groups.append((match.group(1).strip(), []))
            groups[-1][1].append(node.target.id)
        previous_end = node.end_lineno or node.lineno
    return [(title[:1].upper() + title[1:], names) for title, names in groups if names]


def _type(name: str) -> str:
    annotation = Settings.__annotations__[name]
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    bounds = []
    for item in Settings.model_fields[name].metadata:
        for attribute, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(item, attribute, None)  # annotated_types.Ge(ge=1) and its kin, as pydantic keeps them
            if bound is not None:
                bounds.append(f"{symbol} {_value(bound)}")
    return f"`{_code(text)}`" + (f" ({', '.join(bounds)})" if bounds else "")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | dict):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.15g}"  # 1e+15, 0.05, 300: as short as the value, and what the variable may be set to
    return str(value)


def _default(field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "doc_default" in extra:
        return f"`{_code(str(extra['doc_default']))}` (computed)"
    if field.default_factory is not None:
        if field.default_factory in (list, dict):
            return f"`{_value(field.default_factory())}`"
        raise MissingDescription("a computed default needs json_schema_extra={'doc_default': ...} to be documented")
    if field.default is PydanticUndefined or field.default is None:
        return "none"
    return f"`{_code(_value(field.default))}`"


def _code(text: str) -> str:
    """A code span inside a table cell: only the pipe needs escaping (entities would show as typed)."""
    return text.replace("|", "\\|")


def _cell(text: str) -> str:
    """One line of a table cell: pipes escaped, angle brackets kept as text rather than read as HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render() -> str:
    """The whole page (pure but for reading core/settings.py)."""
    out = [HEADER]
    missing = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    if missing:
        raise MissingDescription(f"settings without a description (add one to its Field): {', '.join(missing)}")
    listed = set()
    for title, names in areas():
        out += [f"## {title}", "", "| variable | type | default | description |", "|---|---|---|---|"]
        for name in names:
            field = Settings.model_fields[name]
            listed.add(name)
            out.append(f"| `TOCSIN_{name.upper()}` | {_type(name)} | {_default(field)} | {_cell(field.description or '')} |")
        out.append("")
    unlisted = set(Settings.model_fields) - listed
    if unlisted:  # a field declared some way areas() does not see
        raise MissingDescription(f"settings the reference could not place: {', '.join(sorted(unlisted))}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, "python -m core.settings_doc", summary=True)
    parser.add_argument("--write", action="store_true", help=f"rewrite {PAGE.relative_to(PAGE.parents[1])}")
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        PAGE.write_text(page)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
