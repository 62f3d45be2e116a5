"""``python -m subscriptions.admin``: accounts from the command line (operators, closed sign-up).

    python -m subscriptions.admin create-user ada@example.com --operator   # prints a generated password
    python -m subscriptions.admin create-user ada@example.com --password-stdin < secret.txt
    python -m subscriptions.admin set-role ada@example.com operator
    python -m subscriptions.admin republish-catalog   # the 'catalog' watchdog fired: readers start afresh
"""

from __future__ import annotations

import argparse
import secrets
import sys

import redis
from sqlalchemy import func, select

from core.settings import Settings, get_settings
from subscriptions.accounts import AccountService
from subscriptions.db import session_factory
from subscriptions.errors import Conflict, NotFound
from subscriptions.models import ROLES, User
from subscriptions.schemas import SignUpIn
from subscriptions.service import CatalogPublisher

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subscriptions.admin", description=__doc__.splitlines()[0])
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
    args = parser.parse_args(argv)
    settings = get_settings()
    try:
        if args.command == "create-user":
            given = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
            user, password = create_user(settings, args.email, given, "operator" if args.operator else "user")
            print(f"created {user.email} ({user.role})" + ("" if given else f"; password: {password}"))
        elif args.command == "republish-catalog":
            with session_factory(settings.database_url)() as session:
                publisher = CatalogPublisher(session, settings, redis.Redis.from_url(settings.redis_url))
                publisher.resnapshot()
                print(f"published the catalog as version {publisher.log.version()}")
        else:
            with session_factory(settings.database_url)() as session:
                user = AccountService(session, settings).set_role(args.email, args.role)
            print(f"{user.email} is now {user.role}")
    except (Conflict, NotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
