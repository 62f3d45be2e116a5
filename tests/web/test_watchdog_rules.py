"""The dead man's switch's rules, as pure functions of samples (no Redis, no clock)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.evaluator_status import evaluator_status
from core.settings import Settings
from web.watchdog import (
    RuleStatus,
    changes,
    clock,
    degraded,
    down,
    evaluate,
    notification,
    restarting,
    stalled,
    storage,
)

SETTINGS = Settings(watchdog_stall_s=60, watchdog_startup_s=300, watchdog_window_s=300, watchdog_max_refused_share=0.05,
                    watchdog_min_records=500, watchdog_restart_window_s=900, watchdog_max_restarts=3,
                    evaluator_stale_s=30)


def _samples(n: int, every_s: float = 2.0, *, clock=lambda i: 1_000 * i, log_end=lambda i: 100 * i,
             heartbeat=lambda i, t: t, **counters) -> list[dict]:
    out = []
    for i in range(n):
        t = 1_000.0 + i * every_s
        out.append({"t": t, "clock": clock(i), "log_end": log_end(i), "heartbeat_at": heartbeat(i, t),
                    **{name: f(i) for name, f in counters.items()}})
    return out


def test_a_healthy_stream_fires_nothing() -> None:
    history = _samples(200)
    assert not any(s.firing for s in evaluate(history, [900.0], SETTINGS, history[-1]["t"]).values())


def test_stall_fires_when_clocks_stop_while_records_arrive_and_says_since_when() -> None:
    history = _samples(100, clock=lambda i: 1_000 * min(i, 40))  # the clock stops at sample 40 (t = 1080)
    status = stalled(history, [], SETTINGS, history[-1]["t"])
    assert status.firing and status.since == 1_080.0 and "5900 records arrived" in status.detail
    # not yet at 59 s of stillness
    assert not stalled(history[:70], [], SETTINGS, history[69]["t"]).firing
    assert stalled(history[:71], [], SETTINGS, history[70]["t"]).firing


def test_no_stall_when_nothing_arrives_or_when_the_job_just_restarted() -> None:
    quiet = _samples(100, clock=lambda i: 5, log_end=lambda i: 7)
    assert not stalled(quiet, [], SETTINGS, quiet[-1]["t"]).firing, "no records, nothing to evaluate"
    still = _samples(100, clock=lambda i: None)
    assert stalled(still, [], SETTINGS, still[-1]["t"]).detail.startswith("no shard has evaluated yet")
    assert not stalled(still, [still[-1]["t"] - 30], SETTINGS, still[-1]["t"]).firing, "starting is not stalling"
    long = _samples(200, every_s=2.0, clock=lambda i: None)  # 398 s of samples
    assert not stalled(long, [long[-1]["t"] - 250], SETTINGS, long[-1]["t"]).firing, "a slow first batch is allowed"
    assert stalled(long, [long[-1]["t"] - 350], SETTINGS, long[-1]["t"]).firing, "but not for ever"


def test_kafka_errors_in_some_samples_do_not_confuse_the_stall_rule() -> None:
    history = _samples(100, clock=lambda i: 3, log_end=lambda i: None if i % 3 else 10 * i)
    assert stalled(history, [], SETTINGS, history[-1]["t"]).firing


def test_refused_share_fires_above_the_threshold_once_enough_records_arrived() -> None:
    bad = _samples(100, log_end=lambda i: 100 * i, future_events_refused=lambda i: 10 * i)  # 10 % refused
    status = degraded(bad, SETTINGS, bad[-1]["t"])
    assert status.firing and "10.0% > 5.0%" in status.detail
    few = _samples(3, log_end=lambda i: 100 * i, dead_lettered=lambda i: 50 * i)  # 50 % of 200 records
    assert not degraded(few, SETTINGS, few[-1]["t"]).firing, "too few records to judge"
    applied = _samples(100, late_events_applied=lambda i: 50 * i)  # late but applied: nothing lost
    assert not degraded(applied, SETTINGS, applied[-1]["t"]).firing


@given(st.integers(0, 20), st.integers(0, 20), st.integers(0, 5))
def test_a_few_refused_future_records_in_a_busy_stream_never_trip_the_switch(events: int, beats: int,
                                                                             dead: int) -> None:
    """Future-dated events and heartbeats are refused and counted; the clean stream keeps the clocks moving."""
    history = _samples(150, future_events_refused=lambda i: events if i > 75 else 0,
                       future_heartbeats_refused=lambda i: beats if i > 75 else 0,
                       dead_lettered=lambda i: dead if i > 75 else 0)
    assert not any(s.firing for s in evaluate(history, [500.0], SETTINGS, history[-1]["t"]).values())


def test_counter_resets_do_not_count_as_refusals() -> None:
    history = _samples(100, late_events_dropped=lambda i: 10_000 if i < 50 else 0)
    assert not degraded(history, SETTINGS, history[-1]["t"]).firing


def test_restarts_fire_beyond_the_allowed_count_in_the_window() -> None:
    assert not restarting([100, 200, 300], SETTINGS, 400).firing
    status = restarting([100, 200, 300, 350], SETTINGS, 400)
    assert status.firing and status.since == 350
    assert not restarting([100, 200, 300, 350], SETTINGS, 100 + 900 + 1).firing, "old starts age out"


def test_down_when_the_heartbeat_is_old_or_never_came() -> None:
    history = _samples(10, heartbeat=lambda i, t: 1_000.0)
    assert not down(history, SETTINGS, 1_029).firing
    status = down(history, SETTINGS, 1_031)
    assert status.firing and status.since == 1_000.0
    never = _samples(20, heartbeat=lambda i, t: None)
    assert down(never, SETTINGS, never[0]["t"] + 31).firing and not down(never, SETTINGS, never[0]["t"] + 29).firing


def test_incidents_open_once_keep_their_start_and_resolve_once() -> None:
    firing = {"stalled": RuleStatus(True, 50.0, "stuck")}
    opened, announce = changes({}, firing, 60.0)
    assert announce == [("stalled", "firing", {"since": 50.0, "detail": "stuck"})]
    again, announce = changes(opened, {"stalled": RuleStatus(True, 55.0, "stuck more")}, 62.0)
    assert announce == [] and again["stalled"]["since"] == 50.0
    closed, announce = changes(again, {"stalled": RuleStatus(False)}, 70.0)
    assert closed == {} and [(r, s) for r, s, _ in announce] == [("stalled", "resolved")]
    assert changes(closed, {"stalled": RuleStatus(False)}, 72.0) == ({}, [])


def test_notifications_of_one_incident_have_stable_distinct_ids() -> None:
    incident = {"since": 50.0, "detail": "stuck"}
    first, copy = notification("stalled", "firing", incident, 60.0), notification("stalled", "firing", incident, 61.0)
    resolved = notification("stalled", "resolved", incident, 70.0)
    assert first["notification_id"] == copy["notification_id"] != resolved["notification_id"]
    assert first["state"] == "firing" and resolved["state"] == "resolved" and first["operator"] is True
    assert first["subscription_name"] == "Tocsin dead man's switch: stalled"


def test_evaluator_status_tells_absent_starting_ready_and_stale_apart() -> None:
    now = 10_000.0
    assert evaluator_status({}, SETTINGS, now).state == "absent"
    started = {"driver_started_at": str(now - 20), "driver_heartbeat_at": str(now - 1)}
    assert evaluator_status(started, SETTINGS, now).state == "starting"
    old_clocks = {**started, "shard_0_evaluated_at": "5", "last_batch_at": str(now - 3_600)}
    assert evaluator_status(old_clocks, SETTINGS, now).state == "starting", "clocks of an earlier run do not count"
    ready = {**old_clocks, "last_batch_at": str(now - 2)}
    assert evaluator_status(ready, SETTINGS, now).ready
    stale = evaluator_status({**ready, "driver_heartbeat_at": str(now - 45)}, SETTINGS, now)
    assert stale.state == "stale" and "45 s" in stale.reason


def test_catalog_fires_once_the_shards_were_behind_an_unreachable_version_for_the_limit() -> None:
    from web.watchdog import catalog
    settings = Settings(watchdog_catalog_s=60)
    stuck = {"held": 7, "published": 9, "problem": "the change log stops at version 7 of 9"}
    history = _samples(5)
    assert not catalog(history, settings, history[-1]["t"]).firing, "nothing reported: nothing fires"
    history[-1] |= {"catalog_stuck_since": 1_000.0, "catalog_stuck": stuck}
    assert not catalog(history, settings, 1_059.0).firing, "a catch-up may take a moment"
    status = catalog(history, settings, 1_061.0)
    assert status.firing and status.since == 1_000.0
    assert "version 7 of 9 published" in status.detail and "stops at version 7" in status.detail
    assert evaluate(history, [], settings, 1_061.0)["catalog"].firing


def _streams(history: list[dict], **streams) -> list[dict]:
    """Declared streams in each sample: name -> f(i) giving the stream's entry (None: not declared then)."""
    for i, sample in enumerate(history):
        entries = {name: f(i) for name, f in streams.items()}
        sample["streams"] = {name: entry for name, entry in entries.items() if entry is not None}
    return history


def _moving(i: int) -> dict:
    return {"clock": 1_000 * i, "log_end": 10 * i}


def test_a_stream_whose_clock_stops_while_its_topic_grows_fires_stream_naming_only_it() -> None:
    from web.watchdog import stream
    history = _streams(_samples(100), hosts=lambda i: {"clock": 1_000 * min(i, 40), "log_end": 10 * i},
                       busy=_moving, idle=lambda i: {"clock": 7, "log_end": 3})  # hosts' clock stops at t = 1080
    statuses = evaluate(history, [900.0], SETTINGS, history[-1]["t"])
    status = statuses["stream"]
    assert status.firing and status.since == 1_080.0
    assert status.detail == "stream hosts: shard clock stuck at 40000 while 590 records arrived"
    assert [rule for rule, s in statuses.items() if s.firing] == ["stream"], "trades is healthy"
    assert not stream(history[:70], [900.0], SETTINGS, history[69]["t"]).firing, "not yet at 59 s of stillness"
    assert stream(history[:71], [900.0], SETTINGS, history[70]["t"]).firing


def test_a_stream_declared_or_restarted_lately_gets_the_startup_allowance() -> None:
    from web.watchdog import stream
    never = lambda i: None if i < 50 else {"clock": None, "log_end": 10 * i}  # noqa: E731 - declared at t = 1100
    history = _streams(_samples(150), new=never)
    assert stream(history[:81], [900.0], SETTINGS, history[80]["t"]).detail.startswith(
        "stream new: no shard has evaluated yet while"), "60 s with records and no evaluation"
    started = _streams(_samples(200), new=lambda i: None if never(i) is None else {**never(i), "started_at": 1_100.0})
    assert not stream(started[:190], [900.0], SETTINGS, started[189]["t"]).firing, "a query's first batch may be slow"
    assert stream(started, [900.0], SETTINGS, 1_100.0 + 301).firing, "but not for ever"
    job = _streams(_samples(200), new=never)  # the whole job restarted: every stream query with it
    assert not stream(job, [job[-1]["t"] - 100], SETTINGS, job[-1]["t"]).firing


def test_a_stream_query_failing_again_and_again_fires_with_its_error() -> None:
    from web.watchdog import stream
    failing = {"failures": 3, "since": 1_010.0, "error": "StreamingQueryException: checkpoint unreadable"}
    history = _streams(_samples(20), bad=lambda i: {**_moving(i), "failing": failing}, good=_moving)
    status = stream(history, [900.0], SETTINGS, history[-1]["t"])
    assert status.firing and status.since == 1_010.0
    assert status.detail == "stream bad: its query failed 3 times in a row (last: StreamingQueryException: checkpoint unreadable)"
    twice = _streams(_samples(20), bad=lambda i: {**_moving(i), "failing": {**failing, "failures": 2}})
    assert not stream(twice, [900.0], SETTINGS, twice[-1]["t"]).firing, "a restart or two is what backoff is for"
    recovered = _streams(_samples(20), bad=lambda i: {**_moving(i), **({"failing": failing} if i < 19 else {})})
    assert not stream(recovered, [900.0], SETTINGS, recovered[-1]["t"]).firing, "the supervisor cleared it"
    assert not stream(_streams(_samples(20), bad=lambda i: {**_moving(i), "failing": {"failures": "many"}}),
                      [900.0], SETTINGS, 1_040.0).firing, "an unreadable record is no failure"


def test_one_stream_incident_names_every_bad_stream_from_the_earliest() -> None:
    from web.watchdog import stream
    history = _streams(_samples(100), a=lambda i: {"clock": 5, "log_end": 10 * i},  # stuck since t = 1000
                       b=lambda i: {**_moving(i), "failing": {"failures": 9, "since": 1_150.0, "error": "boom"}},
                       c=lambda i: {"clock": 5, "log_end": None if i % 2 else 10 * i})  # Kafka answers every other time
    status = stream(history, [900.0], SETTINGS, history[-1]["t"])
    assert status.firing and status.since == 1_000.0
    assert status.detail.startswith("stream a: shard clock stuck at 5 while 990 records arrived; "
                                    "stream b: its query failed 9 times in a row (last: boom); stream c: ")
    assert "stream" not in {r for r, s in evaluate(_samples(100), [900.0], SETTINGS, 1_198.0).items() if s.firing}, \
        "samples without streams (taken before any was declared) fire nothing"


@given(st.lists(st.integers(0, 50), min_size=60, max_size=120), st.integers(1, 25))
def test_an_idle_stream_or_one_whose_clock_keeps_moving_never_fires(arrivals: list[int], every: int) -> None:
    """Records arrive in bursts; one clock moves at least every ``every`` samples (< 60 s), the other topic is idle."""
    from web.watchdog import stream
    ends = [sum(arrivals[: i + 1]) for i in range(len(arrivals))]
    history = _streams(_samples(len(arrivals)), live=lambda i: {"clock": i // every, "log_end": ends[i]},
                       idle=lambda i: {"clock": None if i < 5 else 1, "log_end": 0})
    assert not stream(history, [900.0], SETTINGS, history[-1]["t"]).firing


def test_clock_fires_while_a_source_dated_records_ahead_within_the_window_and_names_it() -> None:
    history = _samples(10)
    now = history[-1]["t"]
    fast = {"stream": "trades", "source": "partition 3", "ahead_ms": 240_000, "at": now - 20}
    token = {"stream": "hosts", "source": "publisher token 'collector' (#5)", "ahead_ms": 61_500, "at": now - 5}
    history[-1]["clock_ahead"] = [fast, token]
    status = clock(history, SETTINGS, now)
    assert status.firing and status.since == now - 20
    assert "stream trades, partition 3: records 240.0 s ahead" in status.detail
    assert "stream hosts, publisher token 'collector' (#5): records 61.5 s ahead" in status.detail
    assert evaluate(history, [], SETTINGS, now)["clock"].firing
    history[-1]["clock_ahead"] = [{**fast, "at": now - SETTINGS.watchdog_window_s - 1}]
    assert not clock(history, SETTINGS, now).firing, "a source seen ahead before the window is no longer news"
    assert not clock(_samples(10), SETTINGS, now).firing


def _handoff(n: int, **streams) -> list[dict]:
    """Samples whose ``handoff`` holds, per stream, ``f(i) -> (waiting, stored)``."""
    return _samples(n, handoff=lambda i: {name: list(f(i)) for name, f in streams.items()})


def test_storage_fires_once_a_streams_handoff_held_alerts_without_storing_any_for_the_stall_limit() -> None:
    # trades: handed over at sample 10 (t = 1020), later batches add, nothing is stored; hosts stores all the while
    stuck = _handoff(100, trades=lambda i: (0 if i < 10 else 500 + i, 7), hosts=lambda i: (1_000, i))
    assert not storage(stuck[:40], SETTINGS, stuck[39]["t"]).firing  # 58 s
    status = storage(stuck[:41], SETTINGS, stuck[40]["t"])
    assert status.firing and status.since == 1_020.0
    assert status.detail.startswith("stream trades: 540 evaluated alerts wait to be stored") and "hosts" not in status.detail
    assert evaluate(stuck, [], SETTINGS, stuck[-1]["t"])["storage"].firing
    both = _handoff(100, trades=lambda i: (5, 1), hosts=lambda i: (3, 2))
    assert storage(both, SETTINGS, both[-1]["t"]).detail.count("stream ") == 2
    stored = _handoff(100, trades=lambda i: (500 if i < 60 else 0, 0))
    assert not storage(stored, SETTINGS, stored[-1]["t"]).firing  # stored in the end: it no longer fires
    assert not storage(_samples(100), SETTINGS, 1_198.0).firing  # samples from before the handoff was sampled


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), min_size=2, max_size=120), st.integers(1, 14))
def test_a_handoff_that_stores_something_every_so_often_never_fires_storage(batches: list, every: int) -> None:
    """Batches add any amount, even more than is stored; the thread stores a piece at least every ``every``
    samples (< 60 s apart) while it holds some."""
    held, stored, counts = 0, 0, []
    for i, (added, piece) in enumerate(batches):
        if held and (piece or i % every == 0):
            taken = min(held, piece or 1)
            held, stored = held - taken, stored + taken
        held += added
        counts.append((held, stored))
    history = _handoff(len(counts), trades=lambda i: counts[i])
    assert not storage(history, SETTINGS, history[-1]["t"]).firing
