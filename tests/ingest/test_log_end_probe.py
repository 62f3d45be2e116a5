"""One long-lived Kafka client answers "where do the logs end?" again and again, correctly each time."""

from __future__ import annotations

import threading
import time

import pytest

from core.settings import Settings
from devstack.patience import patient
from devstack.services import free_port
from ingest.kafka import LogEndProbe, TopicMissing, ensure_topics, topic_end_offsets
from ingest.model import Event
from ingest.publisher import EventPublisher
from tests.topics import delete_topic
from web import ops


def _publish(settings: Settings, n: int, start: int = 0) -> None:
    with EventPublisher(settings) as publisher:
        for i in range(start, start + n):
            publisher.publish(Event(key=f"K{i % 2}", ts=1_800_000_000_000 + i, price=1, volume=1))


def test_a_kept_client_sees_the_logs_grow(settings: Settings) -> None:
    """The evaluator's source asks before every batch over one client, each question starting where the last ended."""
    ensure_topics(settings)
    probe = LogEndProbe(settings.kafka_bootstrap, settings.events_topic, timeout_s=5, keep_client=True)
    try:
        assert probe.ends() == dict.fromkeys(range(settings.event_partitions), 0)
        client = probe._consumer
        _publish(settings, 30)
        first = probe.ends()
        assert sum(first.values()) == 30 and first == topic_end_offsets(settings, settings.events_topic)
        for more in (1, 17, 250, 0):  # small and multi-record batches, and none: each answer is the current log end
            _publish(settings, more, start=sum(first.values()))
            again = probe.ends()
            assert again == topic_end_offsets(settings, settings.events_topic)
            first = again
        assert sum(first.values()) == 30 + 1 + 17 + 250 and probe._consumer is client, "one client throughout"
    finally:
        probe.close()


def test_a_question_that_fails_over_the_kept_client_is_asked_again_over_a_new_one(settings: Settings) -> None:
    """A failed question over the source's kept client failed the query (the supervisor restarts it, tens of seconds
    without alerts), though a new client would have answered: here the kept client is broken (closed under the
    probe), and the question is answered over a new one."""
    ensure_topics(settings)
    _publish(settings, 12)
    probe = LogEndProbe(settings.kafka_bootstrap, settings.events_topic, timeout_s=patient(10), keep_client=True)
    try:
        assert sum(probe.ends().values()) == 12
        broken = probe._consumer
        broken.close()  # a client in a state of its own: every call on it fails
        _publish(settings, 5, start=12)
        assert probe.ends() == topic_end_offsets(settings, settings.events_topic)
        assert sum(probe.ends().values()) == 17 and probe._consumer is not broken
    finally:
        probe.close()


def test_the_sampler_keeps_no_client_so_a_topic_created_again_cannot_crash_the_web_process(settings: Settings) -> None:
    """librdkafka 2.16 crashed the process (SIGSEGV) when a client that had read a topic assigned it again after the
    topic was deleted and created anew, as a stream deleted and declared again does: the dashboard's sampler (in the
    web process) makes a client a question, and answers the new topic's ends."""
    ensure_topics(settings)
    _publish(settings, 40)
    assert sum(ops.log_ends(settings).values()) == 40
    delete_topic(settings)
    ensure_topics(settings)
    _publish(settings, 3)
    assert sum(ops.log_ends(settings).values()) == 3


def test_a_probe_of_a_broker_that_is_down_gives_up_within_its_own_timeout(settings: Settings) -> None:
    """kafka-python waited 30 s for a first connection by default: /readyz and the web app's shutdown (which waits
    for the sampler's probe) waited that long with the broker down (28 s seen). A probe's first connection is
    bounded by its timeout."""
    down = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}"})
    probe = LogEndProbe(down.kafka_bootstrap, down.events_topic, timeout_s=1)
    started = time.monotonic()
    with pytest.raises(Exception, match="bootstrap"):
        probe.ends()
    assert time.monotonic() - started < patient(15)  # 30 s unbounded; about 1 s bounded


def test_readiness_with_the_broker_down_answers_within_the_probe_timeout(settings: Settings) -> None:
    """/readyz asked the broker over a fresh client whose first connection was not bounded: with the broker down
    (or too busy to answer, as on a loaded CI machine) readiness hung for kafka-python's 30 s and its callers'
    own timeouts fired first. It answers 503 naming the stream within about its probe's timeout."""
    from tests.users import api_client

    down = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}"})
    started = time.monotonic()
    with pytest.raises(Exception, match="bootstrap"):
        topic_end_offsets(down, down.events_topic, timeout_s=1)
    assert time.monotonic() - started < patient(15)  # 30 s unbounded
    with api_client(down) as api:
        started = time.monotonic()
        ready = api.get("/readyz")
        took = time.monotonic() - started
    assert ready.status_code == 503 and ready.json()["checks"]["stream"].startswith("error"), ready.text
    assert took < patient(15), f"/readyz took {took:.1f} s with the broker down"


def test_a_probe_of_a_topic_that_does_not_exist_fails_at_once_and_one_being_created_is_waited_for(
    settings: Settings,
) -> None:
    """The dashboard's probe of a missing topic waited its whole timeout (and the web app's shutdown with it: ~2 s
    of every web test's teardown) before a TimeoutError; the broker's metadata already said the topic is not there.
    Callers that wait for a topic being created (``topic_end_offsets``' default, the evaluator's source) still
    wait."""
    probe = LogEndProbe(settings.kafka_bootstrap, settings.events_topic, timeout_s=patient(60))
    try:
        with pytest.raises(TopicMissing, match=settings.events_topic):
            probe.ends()
        with pytest.raises(TopicMissing):
            topic_end_offsets(settings, settings.events_topic, timeout_s=patient(60), wait_for_topic=False)
        creating = threading.Timer(1.0, ensure_topics, args=(settings,))
        creating.start()
        try:  # asked before the topic exists, answered once it does
            assert topic_end_offsets(settings, settings.events_topic, timeout_s=patient(60)) == dict.fromkeys(
                range(settings.event_partitions), 0)
        finally:
            creating.join()
        assert probe.ends() == dict.fromkeys(range(settings.event_partitions), 0)
    finally:
        probe.close()
