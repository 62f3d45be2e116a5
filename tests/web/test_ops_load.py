"""The operators' load table: the evaluator's groups per stream and dimension filter (issue 15), on a real database."""

from __future__ import annotations

from core.settings import Settings
from core.streams import StreamSchema
from subscriptions.db import session_factory
from subscriptions.language import format_condition, parse_condition
from subscriptions.models import Subscription
from tests.users import new_user
from web.ops import stream_load, subscription_load

HOSTS = StreamSchema(name="hosts", attributes=[{"name": "cpu"}], dimensions=[{"name": "region"}],
                     retention_ms=60_000, partitions=1)


def test_the_load_table_groups_per_stream_and_filter(settings: Settings) -> None:
    user, _ = new_user(settings)
    rows = [("SUM(volume) OVER 1m > 5", None, True), ("SUM(volume) OVER 1m > 9", None, False),
            ("AVG(cpu) OVER 1m > 9 WHERE region = 'eu'", HOSTS, True),
            ("AVG(cpu) OVER 1m > 5 WHERE region = 'eu' AND key STARTS WITH 'w'", HOSTS, True),  # the prefix: keys
            ("AVG(cpu) OVER 1m > 5", HOSTS, True)]
    with session_factory(settings.database_url)() as session:
        for i, (text, stream, active) in enumerate(rows):
            condition = parse_condition(text, stream)
            session.add(Subscription(owner_id=user.id, name=f"s{i}", condition=format_condition(condition),
                                     condition_spec=condition.to_dict(), keys=None, active=active, policy={}))
        session.commit()
        load = subscription_load(session)
    assert [(g["stream"], g["filter"], g["value"], g["window"], g["active"], g["paused"]) for g in load] == [
        ("hosts", "WHERE region = 'eu'", "AVG(cpu)", "1m", 2, 0),
        ("hosts", "", "AVG(cpu)", "1m", 1, 0),
        ("trades", "", "SUM(volume)", "1m", 1, 1),
    ]
    assert stream_load(load) == [{"stream": "hosts", "groups": 2, "active": 3, "paused": 0},
                                 {"stream": "trades", "groups": 1, "active": 1, "paused": 1}]
