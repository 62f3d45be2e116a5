"""Every string the API accepts fits the column it is stored in.

PostgreSQL enforces ``VARCHAR(n)`` (a longer value is a 500), SQLite does not, so a schema allowing
more than its column passes every SQLite test. This reads the OpenAPI spec: each schema a request
body uses is mapped to the table it is stored in (or said not to be stored as columns), and each of
its string fields with a same-named ``String(n)`` column must be bounded by at most ``n``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String

from core.settings import Settings
from subscriptions.models import ApiToken, Base, Endpoint, PublisherToken, Stream, Subscription, User
from web.app import create_app

STORED_AS: dict[str, type[Base]] = {
    "SubscriptionIn": Subscription, "EndpointIn": Endpoint, "EndpointTemplateIn": Endpoint, "TokenIn": ApiToken,
    "LoginTokenIn": ApiToken, "PublisherTokenIn": PublisherToken, "StreamIn": Stream, "Credentials": User,
    "SignUpIn": User,
}
NOT_STORED = {  # kept whole in a JSON or Text column, or not kept at all (AlertPolicy-Input: its request form)
    "AlertPolicy", "AlertPolicy-Input", "Attribute", "Dimension", "MatcherIn", "SilenceIn", "ConditionIn", "TemplatePreviewIn",
    "InvitationIn", "MuteIn", "PasswordChangeIn", "BacktestIn",  # BacktestIn: kept in Redis, whole (subscriptions.backtests)
}


def _spec() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[1]} if "$ref" in node else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node))
    return set()


def _request_schemas(spec: dict[str, Any]) -> set[str]:
    """The schemas of every request body, and the schemas they hold."""
    pending = set().union(*(_refs(op.get("requestBody", {})) for path in spec["paths"].values()
                            for op in path.values() if isinstance(op, dict)))
    found: set[str] = set()
    while pending:
        name = pending.pop()
        found.add(name)
        pending |= _refs(spec["components"]["schemas"][name]) - found
    return found


def _max_length(prop: dict[str, Any]) -> int | None:
    lengths = [prop.get("maxLength")] + [_max_length(option) for option in prop.get("anyOf", [])]
    bounded = [length for length in lengths if length is not None]
    return max(bounded) if bounded else None


def test_every_request_schema_is_known_to_be_stored_or_not() -> None:
    unknown = _request_schemas(_spec()) - set(STORED_AS) - NOT_STORED
    assert not unknown, f"map these to their table in STORED_AS, or list them in NOT_STORED: {unknown}"


def test_no_string_the_api_accepts_is_longer_than_its_column() -> None:
    schemas = _spec()["components"]["schemas"]
    checked, too_long = 0, []
    for name, model in STORED_AS.items():
        columns = model.__table__.columns
        for field, prop in schemas[name]["properties"].items():
            if field in columns and isinstance(columns[field].type, String) and columns[field].type.length:
                checked += 1
                allowed, column = _max_length(prop), columns[field].type.length
                if allowed is None or allowed > column:
                    too_long.append(f"{name}.{field}: up to {allowed} characters into {model.__tablename__}."
                                    f"{field} VARCHAR({column})")
    assert not too_long, too_long
    assert checked >= 8  # names, kinds, targets, e-mail addresses, stream names
