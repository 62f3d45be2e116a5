"""``python -m subscriptions.admin``: accounts from the command line (operators, closed sign-up).

    python -m subscriptions.admin create-user ada@example.com --operator   # prints a generated password
    python -m subscriptions.admin create-user ada@example.com --password-stdin < secret.txt
    python -m subscriptions.admin set-role ada@example.com operator
    python -m subscriptions.admin republish-catalog   # the 'catalog' watchdog fired: readers start afresh

Streams (docs/publishing.md) and publisher tokens::

    python -m subscriptions.admin create-stream hosts --key host --time time --time-format iso8601 \
        --attribute cpu:%:0:100 --attribute mem:bytes --dimension region --partitions 4
    python -m subscriptions.admin list-streams
    python -m subscriptions.admin show-stream hosts
    python -m subscriptions.admin add-attribute hosts disk:%:0:100      # optional: a compatible change
    python -m subscriptions.admin remove-attribute hosts mem            # refused while a subscription uses it
    python -m subscriptions.admin delete-stream hosts                   # refused while a subscription uses it
    python -m subscriptions.admin create-publisher-token collector --stream hosts   # prints the token once
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys

from pydantic import ValidationError
from sqlalchemy import func, select

from core import cli
from core.redis_client import make_redis
from core.settings import Settings, get_settings
from core.streams import Attribute, IncompatibleChange, StreamSchema
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory
from subscriptions.errors import Conflict, Forbidden, NotFound
from subscriptions.models import ROLES, User
from subscriptions.schemas import SignUpIn
from subscriptions.service import CatalogPublisher
from subscriptions.streams import StreamService, TopicError, parse_schema

LOCAL_OPERATOR = "admin@tocsin.local"


def create_user(settings: Settings, email: str, password: str | None, role: str) -> tuple[User, str]:
    """The new account and its password (generated when none is given)."""
    password = password or secrets.token_urlsafe(12)
    data = SignUpIn(email=email, password=password)  # the same rules as the sign-up form
    with session_factory(settings.database_url)() as session:
        return AccountService(session, settings).sign_up(data.email, data.password, role=role), password


def first_operator(settings: Settings) -> str | None:
    """On an empty database, an operator account for the local platform; returns its password."""
    with session_factory(settings.database_url)() as session:
        if session.scalar(select(func.count()).select_from(User)):
            return None
    return create_user(settings, LOCAL_OPERATOR, None, "operator")[1]


def attribute_spec(spec: str, required: bool = True) -> dict:
    """``name[:unit[:min[:max]]]`` (empty parts skipped: ``temp::-40:85``) as an attribute declaration."""
    name, unit, low, high = [*spec.split(":", 3), "", "", ""][:4]
    return {"name": name, "unit": unit or None, "min": float(low) if low else None,
            "max": float(high) if high else None, "required": required}


def _stream_line(schema: StreamSchema, topic: str, version: int) -> str:
    attributes = ", ".join(a.name + (f" [{a.unit}]" if a.unit else "") + ("" if a.required else "?")
                           for a in schema.attributes)
    dimensions = ", ".join(d.name for d in schema.dimensions) or "-"
    return (f"{schema.name}\t{topic}\tv{version}\tkey={schema.key_field}\ttime={schema.time_field} "
            f"({schema.time_format})\tattributes: {attributes}\tdimensions: {dimensions}")


def stream_command(settings: Settings, args: argparse.Namespace) -> None:
    """Run one of the stream commands; errors are raised for ``main`` to print."""
    with session_factory(settings.database_url)() as session:
        service = StreamService(session, settings)
        if args.command == "create-stream":
            data = {"name": args.name, "key_field": args.key, "time_field": args.time, "time_format": args.time_format,
                    "attributes": [attribute_spec(a) for a in args.attribute]
                    + [attribute_spec(a, required=False) for a in args.optional_attribute],
                    "dimensions": [{"name": d} for d in args.dimension], "retention_ms": args.retention_ms,
                    "partitions": args.partitions}
            stream = service.create(parse_schema(data, settings))
            print(f"created stream {stream.name} on topic {stream.topic}")
        elif args.command == "list-streams":
            for stream in service.streams():
                print(_stream_line(service.schema_of(stream), stream.topic, stream.version))
        elif args.command == "show-stream":
            stream = service.get(args.name)
            print(json.dumps({"topic": stream.topic, "version": stream.version, **stream.schema}, indent=2))
        elif args.command in ("add-attribute", "remove-attribute"):
            schema = service.schema_of(service.get(args.name))
            if args.command == "add-attribute":
                attributes = (*schema.attributes, Attribute.model_validate(attribute_spec(args.spec, required=False)))
            else:
                attributes = tuple(a for a in schema.attributes if a.name != args.spec)
                if len(attributes) == len(schema.attributes):
                    raise NotFound(f"stream {args.name!r} has no attribute {args.spec!r}")
            changed = StreamSchema.model_validate({**schema.model_dump(), "attributes": attributes})
            stream = service.update(args.name, changed)
            print(f"stream {stream.name} is now version {stream.version}")
        elif args.command == "delete-stream":
            service.delete(args.name)
            print(f"deleted stream {args.name} and its topic")
        else:
            token, row = service.create_token(args.name, args.stream, None)
            print(f"publisher token {row.name} (id {row.id}) for {', '.join(args.stream)}: {token}")


def _stream_parsers(commands: argparse._SubParsersAction) -> None:
    create = commands.add_parser("create-stream", help="declare a stream and create its Kafka topic")
    create.add_argument("name")
    create.add_argument("--key", help="the key field (default: key)")
    create.add_argument("--time", help="the time field (default: ts)")
    create.add_argument("--time-format", choices=("epoch_ms", "iso8601"), help="default: epoch_ms")
    create.add_argument("--attribute", action="append", default=[], metavar="NAME[:UNIT[:MIN[:MAX]]]",
                        help="a numeric attribute every record carries (repeat for more)")
    create.add_argument("--optional-attribute", action="append", default=[], metavar="NAME[:UNIT[:MIN[:MAX]]]",
                        help="a numeric attribute records may leave out")
    create.add_argument("--dimension", action="append", default=[], help="an optional string dimension")
    create.add_argument("--retention-ms", type=int, help="default: the stream_default_retention_ms setting")
    create.add_argument("--partitions", type=int, help="default: the event_partitions setting")
    commands.add_parser("list-streams", help="one line per declared stream")
    show = commands.add_parser("show-stream", help="a stream's schema as JSON")
    show.add_argument("name")
    add = commands.add_parser("add-attribute", help="add an optional attribute to a stream (compatible)")
    add.add_argument("name")
    add.add_argument("spec", metavar="NAME[:UNIT[:MIN[:MAX]]]")
    remove = commands.add_parser("remove-attribute", help="remove an attribute no subscription uses")
    remove.add_argument("name")
    remove.add_argument("spec", metavar="ATTRIBUTE")
    delete = commands.add_parser("delete-stream", help="delete a stream no subscription uses, and its topic")
    delete.add_argument("name")
    token = commands.add_parser("create-publisher-token", help="a token that may publish to the given streams only")
    token.add_argument("name")
    token.add_argument("--stream", action="append", required=True, help="a stream it may publish to (repeat)")


STREAM_COMMANDS = ("create-stream", "list-streams", "show-stream", "add-attribute", "remove-attribute",
                   "delete-stream", "create-publisher-token")


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, "python -m subscriptions.admin", summary=True)
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create-user", help="create an account")
    create.add_argument("email")
    create.add_argument("--operator", action="store_true", help="with the operator role")
    create.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    role = commands.add_parser("set-role", help="change an account's role")
    role.add_argument("email")
    role.add_argument("role", choices=ROLES)
    commands.add_parser("republish-catalog", help="publish the whole subscription catalog from the database under a "
                        "new version (repairs a change log the evaluator cannot read past)")
    _stream_parsers(commands)
    args = parser.parse_args(argv)
    settings = get_settings()
    try:
        if args.command in STREAM_COMMANDS:
            stream_command(settings, args)
        elif args.command == "create-user":
            given = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
            user, password = create_user(settings, args.email, given, "operator" if args.operator else "user")
            print(f"created {user.email} ({user.role})" + ("" if given else f"; password: {password}"))
        elif args.command == "republish-catalog":
            with session_factory(settings.database_url)() as session:
                publisher = CatalogPublisher(session, settings, make_redis(settings))
                publisher.resnapshot()
                print(f"published the catalog as version {publisher.log.version()}")
        else:
            with session_factory(settings.database_url)() as session:
                user = AccountService(session, settings).set_role(args.email, args.role)
            print(f"{user.email} is now {user.role}")
    except IncompatibleChange as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except ValidationError as exc:
        for error in exc.errors():
            print(f"error: {'.'.join(map(str, error['loc'])) or 'stream'}: {error['msg']}", file=sys.stderr)
        return 2
    except TopicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    except (Conflict, Forbidden, NotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
