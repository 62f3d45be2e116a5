"""The one configuration object of Tocsin.

Every address, port, topic, key prefix and tunable lives here and is read from
``TOCSIN_*`` environment variables (or a ``.env`` file), so that the local runner,
the tests and docker-compose configure the same code in the same way.
"""

from __future__ import annotations

import json
import os
import re
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Secret keys published with Tocsin (docker-compose.yml shipped the first as its default): a deployment using one
#: protects nothing, so Settings refuses them unless ``demo`` is on.
WELL_KNOWN_SECRET_KEYS = frozenset({"5CNBWChqml949lvwExqZltCAmZPQUeheru11a5sYlL0="})


class Settings(BaseSettings):
    # "null" sets an optional setting to none: the only way to unset one whose default is a value
    model_config = SettingsConfigDict(env_prefix="TOCSIN_", env_file=".env", extra="ignore", env_parse_none_str="null")

    # --- Kafka ---------------------------------------------------------------
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma-separated); the local runner starts "
                                       "Tansu there if nothing listens"
    )
    events_topic: str = Field("tocsin.events", description="topic of the built-in 'trades' stream")
    dead_letter_topic: str = Field(
        "tocsin.events.dead-letter", description="topic of rejected records, each with the reason (producers and the "
                                                  "evaluator write it)"
    )
    event_partitions: int = Field(
        4, ge=1, description="partitions of the event topic (fixed when the topic is first created)"
    )
    kafka_request_timeout_ms: int = Field(
        10_000, description="timeout of one request to Kafka (admin, producer and offset queries)"
    )

    # --- Redis (match events, firing sets, counters; Celery broker) ---------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis for alerts, the catalog, counters and (unless "
                                                 "celery_broker_url) the Celery broker"
    )
    redis_prefix: str = Field("tocsin", description="first part of every Redis key: <prefix>:<deployment id>:...")
    deployment_id: str | None = Field(
        None, description="namespaces every Redis key; default: the id created with the database (read at start)"
    )
    celery_broker_url: str | None = Field(
        None, description="Celery's broker, a single Redis (kombu has no Redis Cluster transport); default: redis_url"
    )
    redis_cluster: bool = Field(
        False, description="redis_url names a node of a Redis Cluster (see docs/redis.md); the Celery broker then "
                           "needs TOCSIN_CELERY_BROKER_URL, a single Redis"
    )
    redis_partitions: int = Field(
        1, ge=1, le=1024, description="slot partitions of the per-subscription keys and the alert stream: each is "
                                      "one hash tag, so one Redis Cluster slot (see core.redis_schema)"
    )
    redis_socket_timeout_s: float = Field(
        10.0, gt=0, description="the longest any Redis command (and connecting) may wait for an answer: a node lost "
                                "with its host (no reset, no close) is then an error the outage handling rides out, "
                                "never a read that waits for ever. Longer than every blocking read "
                                "(TOCSIN_DISPATCHER_BLOCK_MS)"
    )
    redis_outage_backoff_base_s: float = Field(
        0.1, gt=0, le=10, description="a long-running process that finds Redis away (a node lost, a cluster failing "
                                      "over) tries again after this long, doubling per try (core.redis_outage)"
    )
    redis_outage_backoff_cap_s: float = Field(
        5.0, gt=0, le=60, description="... up to this long between tries, for as long as the outage lasts"
    )

    # --- Subscriptions store ---------------------------------------------------
    database_url: str = Field(
        "sqlite:///var/tocsin.db", description="SQLAlchemy URL of the subscriptions database: SQLite by default, "
                                                "postgresql+psycopg://... in production"
    )

    # --- Local state -----------------------------------------------------------
    data_dir: Path = Field(
        Path("var"), description="local state: checkpoints, the generated secret key, logs (the SQLite database is "
                                 "TOCSIN_DATABASE_URL's: var/tocsin.db by default, which does not follow this setting)"
    )
    secret_key: SecretStr | None = Field(
        None, description="Fernet key encrypting endpoint secrets at rest; default: generated in data_dir/secret.key"
    )
    demo: bool = Field(
        False, description="a throw-away demo deployment: accepts a well-known secret key (WELL_KNOWN_SECRET_KEYS), "
                           "which anyone can decrypt endpoint secrets with"
    )

    # --- Spark job ---------------------------------------------------------------
    spark_master: str = Field("local[2]", description="local[n], or a standalone master spark://host:port")
    spark_shuffle_partitions: int = Field(
        4, ge=1, description="shuffle partitions of the evaluator's stateful stage, hence its shards; a checkpoint "
                              "keeps the count it was started with"
    )
    spark_driver_host: str = Field(
        "127.0.0.1", description="the address executors reach the driver at (on a cluster: the evaluator's host name)"
    )
    spark_driver_bind_address: str = Field(
        "127.0.0.1", description="the address the driver listens on (0.0.0.0 in a container that executors reach)"
    )
    spark_executor_memory: str = Field(
        "1g", description="heap of each executor JVM on a cluster; must fit a worker's --memory"
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="further Spark settings, applied after ours (JSON object: RocksDB memory "
                                          "caps, a checkpoint file manager, or one of ours reverted)"
    )
    trigger_interval: str = Field(
        "1 second", description="micro-batch trigger: a batch takes what arrived since the last (docs/evaluator.md: "
                                 "batch size)"
    )
    checkpoint_dir: str | None = Field(
        None, description="the evaluator's Spark checkpoint and state store, shared by the driver and every worker: a "
                          "path (made absolute when read) or a URI handed to Spark as it is (file://, hdfs://, s3a://; "
                          "docs/cluster.md says which are tested and which jars each needs); default: "
                          "data_dir/checkpoints/evaluator"
    )
    pane_ms: int = Field(1_000, ge=1, description="pane (basic window) width; windows are multiples")
    watermark_delay_ms: int = Field(2_000, ge=0, description="allowed event-time disorder")
    max_window_ms: int = Field(3 * 3600 * 1000, ge=1, description="longest window a condition may use")
    quantile_max_window_ms: int = Field(
        3_600_000, ge=0, description="longest QUANTILE window: shards keep every event value this long (0: off)"
    )
    source_max_records_per_trigger: int | None = Field(
        400_000, ge=1, description="admission cap per micro-batch: a backlog drains in batches this large (None: all)"
    )
    evaluator_mode: Literal["collective", "naive"] = Field(
        "collective", description="collective indexes, or every subscription on every key (the baseline)"
    )
    evaluator_shards: int | None = Field(None, ge=1, description="default: one per shuffle partition")
    evaluator_p: int = Field(4, ge=1, description="CI-COUNT/CI-SUM stamps per level: error ε = 2/(p+2)")
    evaluator_snapshot_every: int = Field(100, ge=2, description="batches between shard state snapshots")
    stream_refresh_s: float = Field(
        2.0, gt=0, description="how often the evaluator reads the stream registry: a declared stream gets its "
                               "query, a deleted one loses it, a changed one is restarted (docs/evaluator-streams.md)"
    )
    evaluator_stop_timeout_s: float = Field(
        90.0, gt=0, description="how long the runner waits for the evaluator to stop by itself before killing it"
    )
    evaluator_admission_transitions: int | None = Field(
        500_000, ge=1, description="new subscriptions' first transitions each shard admits per micro-batch: a burst "
                                   "of new subscriptions (100,000 over a backlog fire millions at once) is spread over "
                                   "batches, in id order, so the stream and the subscriptions already evaluated never "
                                   "wait behind it; one waiting starts at the boundary of the batch that admits it "
                                   "(docs/evaluator.md: admission); null: every new subscription at once"
    )
    sink_batch_transitions: int | None = Field(
        100_000, ge=1, description="transitions a micro-batch stores itself before it ends; the rest, and the later "
                                   "ones of their subscriptions, are stored after it from the handoff, in order, so "
                                   "a burst (a first evaluation over a backlog) does not hold the stream "
                                   "(docs/evaluator.md: the handoff); null: a batch stores all of its own"
    )
    sink_handoff_max_transitions: int = Field(
        4_000_000, ge=1, description="transitions the handoff holds at most: a batch that would take it past this "
                                     "waits for it to drain first (a burst larger goes in whole into an empty one)"
    )
    sink_dedupe_ttl_s: int = Field(
        7 * 86_400, ge=3_600, description="how long the evaluator's sink remembers the ids of the alerts it stored "
                                          "(per partition and ten minutes of evaluation time, after the set's last "
                                          "write): a batch replayed within it adds nothing (docs/redis.md)"
    )

    # --- the local runner's supervision (devstack.run, docs/operations.md) ----------
    runner_restart_backoff_s: float = Field(
        1.0, gt=0, description="the runner's first wait before restarting a platform process that exited"
    )
    runner_restart_backoff_max_s: float = Field(
        60.0, gt=0, description="the longest wait between restarts (the wait doubles per crash in a row up to this)"
    )
    runner_restart_reset_s: float = Field(
        60.0, gt=0, description="a process up this long is healthy again: its next crash waits the first backoff"
    )
    runner_crash_loop_restarts: int = Field(
        5, ge=1, description="crashes in a row after which the runner reports a process as crash-looping"
    )

    # --- what a record may be (ingest.model.RecordLimits) ---------------------------
    max_record_bytes: int = Field(
        65_536, ge=256, description="larger records are dead-lettered unread (an event is ~80 bytes)"
    )
    max_json_depth: int = Field(
        32, ge=2, description="deeper JSON nesting is dead-lettered before it is parsed (an event is flat)"
    )
    max_event_value: float = Field(
        1e15,
        gt=0,
        description=(
            "largest price/volume accepted. Below 2^53 every whole value is exact in a double, and even a "
            "billion events per second for the longest window sum to ~1e28, nowhere near the float64 range "
            "(1.8e308): no window aggregate can overflow to inf or lose its whole units"
        ),
    )
    dead_letter_raw_bytes: int = Field(
        4_096, ge=64, description="dead letters keep this much of the raw record, with its length and sha256"
    )
    max_future_skew_ms: int = Field(
        300_000,
        ge=0,
        description=(
            "how far event time may run ahead of the processing clock: later events are dead-lettered and "
            "later heartbeats refused, so neither moves the watermark"
        ),
    )

    clock_tolerance_ms: int = Field(
        1_000,
        ge=0,
        description=(
            "a stream's clock (its partitions' progress) runs at most this far ahead of the evaluator's processing "
            "clock: records dated later are kept and count when the clock reaches them, but close no window early. "
            "Keep it below watermark_delay_ms: while a producer runs fast, the others' disorder budget is the "
            "difference (docs/clock.md)"
        ),
    )

    # --- ingest ----------------------------------------------------------------
    heartbeat_interval_ms: int = Field(
        1_000, ge=1, description="how often producers send per-partition heartbeats, so event time advances when "
                                  "keys go quiet"
    )
    feed_rate: float = Field(300.0, gt=0, description="synthetic feed events per second (mean over the day)")
    feed_symbols: int = Field(500, ge=1, description="symbols the synthetic market feed trades")
    feed_seed: int = Field(7, description="random seed of the synthetic feed")
    feed_max_disorder_ms: int = Field(500, ge=0, description="how far out of order the synthetic feed sends events")
    hosts_feed_hosts: int = Field(12, ge=1, le=10_000, description="hosts of the synthetic host-metrics feed")
    hosts_feed_interval_ms: int = Field(1_000, ge=10, description="how often each demo host reports its metrics")

    # --- web -------------------------------------------------------------------
    web_host: str = Field("127.0.0.1", description="address the web app listens on")
    web_port: int = Field(8000, description="port the web app listens on")
    signup_open: bool = Field(True, description="anyone may create an account; else by invitation or the CLI")
    invitation_ttl_s: int = Field(7 * 86_400, ge=60, description="how long an operator's invitation can be used")
    password_min_length: int = Field(10, ge=8, description="shortest password (surrounding spaces not counted)")
    password_max_length: int = Field(256, ge=16, le=4096, description="longest password (bounds hashing work)")
    password_hashing: Literal["rfc9106-low-memory", "rfc9106-high-memory", "cheapest-insecure"] = Field(
        "rfc9106-low-memory", description="Argon2id cost: RFC 9106's profiles (low memory: 64 MiB, 3 passes; high: "
        "2 GiB, 1 pass); `cheapest-insecure` is for test suites only. Stored hashes are renewed at the next login "
        "when it changes"
    )
    session_ttl_s: int = Field(14 * 86_400, ge=60, description="how long a browser session lasts")
    session_cookie_secure: bool = Field(False, description="send the session cookie over HTTPS only")
    login_max_failures: int = Field(10, ge=1, description="failed logins per address before it is locked out")
    login_lockout_s: int = Field(900, ge=1, description="how long failed logins are counted, and the lock-out")
    user_max_subscriptions: int = Field(1_000, ge=0, description="subscriptions one user may have (403 beyond)")
    user_max_endpoints: int = Field(50, ge=0, description="endpoints one user may have (403 beyond)")
    user_max_ranks: int = Field(
        20, ge=0, description="rank subscriptions (IN TOP / BOTTOM k) one user may have, among the subscriptions: each "
                              "sends up to k entries per shard and boundary, a threshold none (403 beyond)"
    )
    subscription_max_keys: int = Field(
        1_000, ge=1, description="keys one subscription may name (bounds what one change adds to the catalog)"
    )
    user_max_tokens: int = Field(20, ge=0, description="API tokens one user may have (403 beyond)")
    # The catalog travels to the evaluator as versioned diffs (see subscriptions.service, core.catalog_log).
    catalog_snapshot_every: int = Field(1_000, ge=1, description="catalog changes between full snapshots in Redis; the "
                                        "change log keeps as many before the snapshot, and readers remember as many")
    catalog_gap_wait_s: float = Field(0.5, ge=0, description="how long a catalog change waits for its predecessor's "
                                      "publication before publishing a full snapshot from the database instead")
    # Limits a public service needs (see web.limits); rates in the notation of `limits`: "10/minute", "5 per hour".
    request_max_bytes: int = Field(1_048_576, ge=1_024, description="largest request body; larger ones get a 413")
    request_body_timeout_s: float = Field(
        30.0, gt=0, description="longest a request body may take to arrive, from the route's first read of it; "
                                "slower: 408 and the connection closed (a slow client holds no worker or buffer)")
    # The web app's database pool (web.deps.web_sessions): a request holds one connection from its first query to its
    # end, and one account at most account_max_requests of them (web.tenants). Other processes keep SQLAlchemy's pool.
    web_db_pool_size: int = Field(5, ge=1, description="database connections a web process keeps open")
    web_db_max_overflow: int = Field(
        10, ge=0, description="connections a web process may open beyond web_db_pool_size while all are in use")
    web_db_pool_timeout_s: float = Field(
        1.0, gt=0, description="how long a request waits for a database connection when all are in use; then 503 "
                               "with Retry-After (never a 500, never the 30 s SQLAlchemy waits by default)")
    account_max_requests: int = Field(
        6, ge=1, description="requests one account (API tokens and browser sessions together) may have in progress "
                             "at once, over every web process (counted in Redis) and in each (counted locally); "
                             "more: 429 with Retry-After before any thread or database connection is taken "
                             "(web.tenants)")
    account_request_lease_s: float = Field(
        120.0, gt=0, description="a request's count in Redis lapses after this long if its web process dies before "
                                 "taking it back")
    account_count_timeout_s: float = Field(
        0.5, gt=0, description="how long a request waits for Redis to count it toward its account's bound; beyond "
                               "(or Redis down) each web process bounds its own requests alone for a few seconds")
    busy_retry_after_s: int = Field(
        1, ge=1, description="the Retry-After of a 429 for an account at account_max_requests and of a 503 for a "
                             "database pool with no connection free within web_db_pool_timeout_s")
    rate_sign_in_client: str = Field("30/minute", description="sign-in attempts per client address")
    rate_sign_up_client: str = Field("10/hour", description="sign-ups per client address")
    rate_preview_account: str = Field("30/minute", description="condition previews per account")
    rate_preview_client: str = Field("60/minute", description="condition previews per client address")
    rate_test_alert_account: str = Field("10/minute", description="test alerts per account")
    rate_test_alert_client: str = Field("20/minute", description="test alerts per client address")
    dashboard_sample_s: float = Field(2.0, gt=0, description="how often the web app samples operator metrics")
    web_sampler: bool = Field(True, description="this web process takes the operators' samples and runs the dead "
                              "man's switch (several share a lock: one per period samples); off: it only serves. "
                              "Keep it on in at least one web process, or nothing pages when the pipeline stalls")
    dashboard_history: int = Field(900, ge=10, description="samples kept for the dashboard charts")
    preview_timeout_s: float = Field(5.0, gt=0, description="how long a condition preview waits for the evaluator")

    # --- backtests (notifier.backtests: a condition over a stream's history, on the worker lane "backtests") ------
    backtest_max_active: int = Field(1, ge=1, le=100, description="backtests one account may have queued or running")
    backtest_max_range_ms: int = Field(7 * 86_400_000, ge=60_000, description="the longest time range one backtest "
                                                                               "may cover (and never beyond retention)")
    backtest_chart_points: int = Field(600, ge=10, le=10_000, description="points per key a backtest's chart has "
                                                                          "at most: the history is read in as many chunks")
    backtest_chart_keys: int = Field(5, ge=1, le=50, description="keys a backtest charts (those with most transitions)")
    backtest_transitions_listed: int = Field(1_000, ge=0, le=100_000, description="transitions a backtest's result "
                                                                                  "lists (the counts cover all)")
    backtest_keep_s: int = Field(86_400, ge=60, description="how long a backtest's result is kept")
    backtest_queue_timeout_s: float = Field(3_600.0, gt=0, description="a backtest queued longer than this is not run "
                                                                     "(the lane was busy or down): it expires")
    backtest_stale_s: float = Field(120.0, gt=0, description="a running backtest that reported no progress this long "
                                                             "is taken as lost with its worker")
    backtest_max_run_s: float = Field(1_800.0, gt=0, description="a backtest running longer is stopped and fails "
                                                               "with the reason: one account's job holds a lane "
                                                               "worker at most this long (docs/backtests.md)")
    backtest_worker_nice: int = Field(10, ge=0, le=19, description="the backtest lane's CPU priority (nice): live "
                                                                   "evaluation keeps the cores it needs")
    rate_backtest_account: str = Field("30/hour", description="backtests per account")

    # --- dead man's switch (web.watchdog) ---------------------------------------
    evaluator_stale_s: float = Field(
        30.0, gt=0, description="no heartbeat from the evaluator driver this long: not ready, and 'evaluator down'"
    )
    watchdog_stall_s: float = Field(
        120.0, gt=0, description="shard clocks still this long while records arrive: 'evaluation stalled'; a "
                                 "sink's handoff holding alerts and storing none this long: 'storage'"
    )
    watchdog_startup_s: float = Field(
        300.0, gt=0, description="how long the job's first evaluation after a start may take before 'stalled'"
    )
    watchdog_window_s: float = Field(300.0, gt=0, description="window of the refused-records share")
    watchdog_max_refused_share: float = Field(
        0.05, ge=0, le=1, description="share of records dropped, refused or dead-lettered that fires 'degraded'"
    )
    watchdog_min_records: int = Field(500, ge=1, description="records in the window before the share is judged")
    watchdog_restart_window_s: float = Field(900.0, gt=0, description="window of the job-restart count")
    watchdog_max_restarts: int = Field(3, ge=0, description="job starts beyond this within the window: 'restarting'")
    watchdog_catalog_s: float = Field(
        60.0, gt=0, description="shards behind a published catalog version they cannot reach this long: 'catalog'"
    )
    watchdog_stream_failures: int = Field(
        3, ge=1, description="failures in a row of a declared stream's query (each restarted with backoff) that fire "
                             "'stream' (as does its shard clock still for watchdog_stall_s while its topic grows)"
    )
    operator_endpoint_ids: list[int] = Field(
        default_factory=list, description="endpoints (made as an operator) the dead man's switch notifies besides "
                                          "the operators' own addresses"
    )
    watchdog_email_operators: bool = Field(
        True, description="the dead man's switch e-mails every operator account at its own address "
                          "(an e-mail endpoint it owns, made for it if missing)"
    )

    # --- notifier ----------------------------------------------------------------
    webhook_connect_timeout_s: float = Field(3.0, gt=0, description="webhook connect timeout")
    webhook_read_timeout_s: float = Field(10.0, gt=0, description="longest silence between two reads of a response")
    webhook_total_timeout_s: float = Field(
        10.0, gt=0, description="deadline of one webhook attempt: resolving, connecting, TLS, sending, the response"
    )
    webhook_max_response_bytes: int = Field(64 * 1024, ge=0, description="most of a response body a worker reads")
    webhook_ca_file: Path | None = Field(None, description="CA bundle to verify HTTPS receivers; default: certifi's")
    webhook_allow_hosts: list[str] = Field(
        default_factory=list,
        description="hosts/IPs exempt from the SSRF guard (e.g. 127.0.0.1 for local testing)",
    )
    smtp_host: str = Field("127.0.0.1", description="SMTP server for e-mail alerts")
    smtp_port: int = Field(1025, description="port of the SMTP server")
    smtp_starttls: bool = Field(False, description="upgrade the connection with STARTTLS before sending")
    smtp_ssl: bool = Field(False, description="implicit TLS (SMTPS, usually port 465)")
    smtp_ca_file: Path | None = Field(None, description="CA bundle to verify the SMTP server; default: system CAs")
    smtp_username: str | None = Field(None, description="SMTP login (with smtp_password); none: no login")
    smtp_password: SecretStr | None = Field(None, description="SMTP password")
    smtp_from: str = Field("Tocsin <alerts@tocsin.local>", description="sender of alert e-mails")
    smtp_timeout_s: float = Field(10.0, description="timeout of one SMTP conversation step")
    delivery_max_retries: int = Field(8, ge=0, description="delivery retries before the dead-letter set")
    delivery_backoff_base_s: float = Field(
        1.0, description="first retry delay: exponential backoff with full jitter from here"
    )
    delivery_backoff_max_s: float = Field(300.0, description="longest retry delay; also caps a receiver's Retry-After")
    delivery_visibility_margin_s: float = Field(
        600.0, gt=0, description="broker visibility timeout beyond the whole retry schedule"
    )
    delivery_endpoint_concurrency: int = Field(2, ge=1, description="attempts in flight at once per endpoint")
    delivery_owner_concurrency: int = Field(3, ge=1, description="attempts in flight at once per endpoint owner")
    delivery_busy_delay_s: float = Field(
        2.0, gt=0, description="a delivery whose owner is at its cap looks again after about this long (doubling up "
                               "to 8x while it stays full); 8x this is also the furthest turn in an endpoint's line"
    )
    delivery_busy_wait_s: float = Field(
        0.5, ge=0, le=2.0, description="a delivery whose own endpoint is full, and quick (twice its last attempt time "
                                        "within this), waits in its thread for a slot, in one of its owner's slots, that "
                                        "long at most before giving the thread back (0: never)"
    )
    delivery_busy_min_delay_s: float = Field(
        0.05, gt=0, description="a delivery whose own endpoint is at its cap, without a turn in its line (no attempt "
                                "of it ended yet, or a wait in the thread given up), looks again after twice that "
                                "endpoint's last attempt time, at least this long"
    )
    delivery_restore_interval_s: int = Field(
        30, ge=1, description="how often workers look for deliveries a dead worker left unacknowledged"
    )
    delivery_store_wait_s: float = Field(
        1.0, gt=0, le=60, description="a delivery that cannot reach Redis (its records) waits this long, then is "
                                      "put back on its queue, never dropped"
    )
    dispatcher_block_ms: int = Field(
        1_000, description="how long the dispatcher blocks reading the alert stream before looking at its timers"
    )
    dispatcher_consumer: str = Field(
        # The host's name: replicas (containers, machines) differ without configuration, and a restarted
        # dispatcher takes its own unacknowledged alerts back at once instead of after the claim idle time.
        default_factory=lambda: f"dispatcher-{socket.gethostname()}",
        description="this dispatcher's consumer name in the group: unique per running dispatcher",
        json_schema_extra={"doc_default": "dispatcher-<host name>"},
    )
    dispatcher_claim_idle_ms: int = Field(
        60_000, ge=1, description="a pending alert another dispatcher read and left unacknowledged this long is "
                                  "claimed (its reader is taken for dead); far above a group's wait and dispatch"
    )
    dispatcher_claim_interval_s: float = Field(5.0, gt=0, description="how often dead dispatchers' entries are claimed, "
                                                                         "and silent deliveries sent again")
    dispatcher_max_deliveries: int = Field(
        10, ge=2, description="an alert entry read this many times (XPENDING's delivery count: reads and claims) "
                              "without being acknowledged is dead-lettered with the reason instead of tried again"
    )
    dispatcher_group_wait_ms: int = Field(
        500, ge=0, description="how long transitions of one evaluation are collected into one notification"
    )
    dispatcher_remind_interval_s: float = Field(5.0, gt=0, description="how often re-notify intervals are checked")

    # --- metrics -----------------------------------------------------------------
    metrics_port_feed: int = Field(9463, description="Prometheus /metrics port of the synthetic feed (0 disables)")
    metrics_port_evaluator: int = Field(9464, description="Prometheus /metrics port of the evaluator (0 disables)")
    metrics_port_dispatcher: int = Field(9465, description="Prometheus /metrics port of the dispatcher (0 disables)")
    metrics_port_worker: int = Field(9466, description="Prometheus /metrics port of a delivery worker (0 disables)")
    metrics_port_hosts_feed: int = Field(
        9467, description="Prometheus /metrics port of the demo host-metrics feed (0 disables)"
    )
    metrics_bind_address: str = Field(
        "127.0.0.1", description="the address the processes without a web server serve /metrics on: this machine "
        "alone by default; the host's address (or 0.0.0.0) where Prometheus scrapes from another host"
    )

    # --- silences (subscriptions.silences, notifier.silences) -----------------------
    user_max_silences: int = Field(100, ge=0, description="silences one user may have pending or active at once")
    silence_max_duration_s: int = Field(
        30 * 86_400, ge=60, description="longest silence (ends_at - starts_at), and how far ahead one may start"
    )
    silence_cache_s: float = Field(
        5.0, gt=0, description="how long the dispatcher reuses an owner's silences: a new or expired silence "
                               "applies to alerts decided at most this long after it was saved"
    )

    # --- receivers: Slack, Teams, PagerDuty and message templates (subscriptions.templating) ---
    pagerduty_severity: Literal["critical", "error", "warning", "info"] = Field(
        "error", description="payload.severity of the PagerDuty events Tocsin triggers")
    pagerduty_attempt_timeout_s: float = Field(
        30.0, gt=0, description="deadline of one PagerDuty attempt, which sends one event per key")
    template_max_chars: int = Field(4000, ge=1, description="longest message template source")
    template_max_output_chars: int = Field(4000, ge=16, description="a rendered message is cut here")
    template_max_intermediate_chars: int = Field(
        20_000, ge=1, description="longest string or list a template may build while rendering")
    template_max_loop_depth: int = Field(2, ge=1, description="deepest nesting of loops in a template")
    template_max_iterations: int = Field(10_000, ge=1, description="loop iterations of one render, all loops together")
    template_max_range: int = Field(1000, ge=1, description="most numbers range() gives a template")

    # --- evaluator processes: shard hosts and the garbage collector -------------------
    evaluator_own_python_workers: bool = Field(
        False, description="the shard operator draws Python workers from a pool of its own (docs/evaluator.md: batch "
                            "size)"
    )
    evaluator_shard_hosts: bool = Field(
        True, description="each shard's copy lives in a process of its own on each executor, which the operator's "
                          "tasks hand their batches to: no catch-up when Spark hands the shard to another Python "
                          "worker (evaluator/spark/shard_host.py; docs/evaluator.md: batch size)"
    )
    evaluator_shard_host_idle_s: float = Field(
        120.0, gt=0, description="a shard host with no batch for this long exits, and its memory with it (a "
                                 "stopped query's; a query that runs again rebuilds the shard from the state store)"
    )
    python_gc_threshold: int = Field(
        50_000, ge=0, description="young-generation threshold of CPython's garbage collector in the evaluator's "
                                  "Python workers (CPython's default 700; 0 leaves it): core/gc_policy.py"
    )
    python_gc_full_interval_s: float = Field(
        60.0, gt=0, description="a Spark Python worker freezes what each task leaves alive, so PySpark's full garbage "
                                "collection after every task walks only new objects; everything is collected once "
                                "this often (core/gc_policy.py)"
    )

    @field_validator("rate_sign_in_client", "rate_sign_up_client", "rate_preview_account", "rate_preview_client",
                     "rate_test_alert_account", "rate_test_alert_client", "rate_backtest_account")
    @classmethod
    def _rate(cls, rate: str) -> str:
        from limits import parse  # a bad rate is a configuration error at start-up, not a 500 later

        parse(rate)
        return rate

    @field_validator("checkpoint_dir", mode="before")
    @classmethod
    def _checkpoint_location(cls, value: str | Path | None) -> str | None:
        return None if value is None else checkpoint_location(value)

    @field_validator("secret_key")
    @classmethod
    def _fernet_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None:
            from cryptography.fernet import Fernet

            try:
                Fernet(key.get_secret_value().encode())
            except ValueError:
                raise ValueError("must be a Fernet key (32 url-safe base64-encoded bytes); "
                                 "make one with: python -c 'from cryptography.fernet import Fernet; "
                                 "print(Fernet.generate_key().decode())'") from None
        return key

    @model_validator(mode="after")
    def _no_well_known_key(self) -> Settings:
        if self.secret_key is not None and self.secret_key.get_secret_value() in WELL_KNOWN_SECRET_KEYS and not self.demo:
            raise ValueError(
                "TOCSIN_SECRET_KEY is a well-known key published with Tocsin: anyone could decrypt the endpoint "
                "secrets stored with it. Set a key of your own (openssl rand -base64 32 | tr '+/' '-_'), or "
                "TOCSIN_DEMO=true for a throw-away demo (docs/production.md)")
        return self

    @model_validator(mode="after")
    def _one_account_leaves_connections_to_others(self) -> Settings:
        pool = self.web_db_pool_size + self.web_db_max_overflow
        if self.account_max_requests + self.publish_threads >= pool:
            raise ValueError(
                f"TOCSIN_ACCOUNT_MAX_REQUESTS ({self.account_max_requests}) + TOCSIN_PUBLISH_THREADS "
                f"({self.publish_threads}) must be below TOCSIN_WEB_DB_POOL_SIZE + TOCSIN_WEB_DB_MAX_OVERFLOW ({pool}): "
                f"one account's requests and publishing's token checks could otherwise hold every database "
                f"connection of a web process")
        return self

    @model_validator(mode="after")
    def _blocking_reads_end_before_the_socket_timeout(self) -> Settings:
        if self.dispatcher_block_ms / 1000 >= self.redis_socket_timeout_s:
            raise ValueError(f"TOCSIN_DISPATCHER_BLOCK_MS ({self.dispatcher_block_ms}) must be below "
                             f"TOCSIN_REDIS_SOCKET_TIMEOUT_S ({self.redis_socket_timeout_s} s): every blocking read "
                             f"would otherwise time out")
        return self

    @model_validator(mode="after")
    def _broker_beside_a_cluster(self) -> Settings:
        if self.redis_cluster and not self.celery_broker_url:
            raise ValueError("TOCSIN_REDIS_CLUSTER needs TOCSIN_CELERY_BROKER_URL: Celery's Redis transport (kombu) "
                             "speaks to a single Redis, not to a Redis Cluster")
        return self

    @property
    def broker_url(self) -> str:
        return self.celery_broker_url or self.redis_url

    @property
    def delivery_retry_schedule_s(self) -> float:
        """Worst-case total of all retry delays of one delivery."""
        return sum(
            min(self.delivery_backoff_base_s * 2**n, self.delivery_backoff_max_s)
            for n in range(self.delivery_max_retries + 1)
        )

    @property
    def delivery_visibility_timeout_s(self) -> int:
        """The broker's visibility timeout: an unacknowledged delivery is handed to another worker after this long."""
        return int(self.delivery_retry_schedule_s + self.delivery_visibility_margin_s)

    @property
    def checkpoint_location(self) -> str:
        """The evaluator's checkpoint as Spark gets it (``checkpointLocation``) and reads it back (through Hadoop's
        FileSystem: ``evaluator.spark.checkpoint_fs``)."""
        return checkpoint_location(self.checkpoint_dir or self.data_dir / "checkpoints" / "evaluator")

    @property
    def local_checkpoint_dir(self) -> Path | None:
        """The checkpoint as a directory of this host (a plain path or a ``file:`` URI), for the processes that
        have no JVM to reach it through; None when it is on another file system (HDFS, S3 ...)."""
        return local_path(self.checkpoint_location)

    # --- windows and no data ---------------------------------------------------
    tuple_max_events: int = Field(
        100, ge=0, le=100_000,
        description="longest tuple window (OVER LAST n EVENTS): shards keep each key's newest n events (0: off)",
    )

    # --- streams and publishing (core.streams, subscriptions.streams, web.api.streams) ---
    stream_topic_prefix: str = Field("tocsin.stream.", description="a stream's topic is this plus its name "
                                     "(the built-in 'trades' stream keeps events_topic)")
    stream_default_retention_ms: int = Field(7 * 86_400_000, ge=60_000, description="a new stream's retention")
    max_streams: int = Field(100, ge=1, description="streams a deployment may declare")
    stream_max_series: int = Field(
        250_000, ge=1, description="series (keys; for a declared stream, key x dimension values x optional "
                                   "attributes carried) a stream may have active within max_window_ms: events of "
                                   "new series beyond it are dead-lettered (core.series_limit)")
    publish_token_series_share: float = Field(
        0.5, gt=0, le=1, description="share of stream_max_series one publisher token may keep active in a stream "
                                     "(its records of new series beyond: rejects), so one broken or hostile "
                                     "collector cannot fill a stream's series and keep the others' new series out")
    stream_series_report_s: float = Field(
        30.0, ge=0, description="an evaluator worker reports a series it admitted to the registry again after at "
                                "most this long (or once its events are 1/16 of the horizon newer): core.series_limit")
    publisher_max_tokens: int = Field(100, ge=0, description="publisher tokens a deployment may hold")
    publish_series_timeout_s: float = Field(
        0.5, gt=0, description="how long a publish request waits for Redis to check the series limit; beyond it "
                               "the evaluator checks alone")
    publish_max_records: int = Field(
        10_000, ge=1, description="records one POST /api/streams/{name}/events may carry (more: 413); the body "
                                  "is also bounded by request_max_bytes")
    publish_queue_max_messages: int = Field(
        500_000, ge=1, description="records the web process's Kafka producer holds undelivered; a batch that "
                                   "does not fit gets a 429 with Retry-After")
    publish_max_inflight_bytes: int = Field(
        64 * 1_048_576, ge=1, description="bytes of records a web process holds undelivered before a 429 (one batch "
                                          "is always admitted when none is in flight)")
    publish_threads: int = Field(
        2, ge=1, le=64, description="threads of the web process's publishing executor (token checks, judging, "
                                    "producing): publishing never takes the threads the UI's pages run on")
    publish_token_share: float = Field(
        0.25, gt=0, le=1, description="share of publish_queue_max_messages and publish_max_inflight_bytes one "
                                      "publisher token may hold undelivered in a web process (beyond: 429 for that "
                                      "token only); a token with nothing in flight is always admitted to its share")
    publish_token_max_requests: int = Field(
        8, ge=1, description="publish requests one publisher token may have in progress at once in a web process "
                             "(more: 429 before the body is read), so one token cannot queue ahead of everyone")
    publish_retry_after_s: int = Field(1, ge=1, description="the Retry-After of a 429 under backpressure")
    publish_linger_ms: int = Field(5, ge=0, description="how long the producer waits to fill a batch to Kafka")
    publish_heartbeat_ms: int = Field(
        1_000, ge=0, description="at most this often, the web process sends a heartbeat at the newest event time it "
                                 "published to a stream to every partition of its topic, so a stream published over "
                                 "HTTP with few keys still moves every partition's clock (0: never)")
    publish_delivery_timeout_ms: int = Field(
        30_000, ge=1_000, description="how long a record may wait for Kafka's acknowledgement before the request "
                                      "that carried it answers 503 (the publisher retries: at least once)")

    def to_env(self) -> dict[str, str]:
        """These settings as ``TOCSIN_*`` variables, to configure a child process identically."""
        env = {}
        for name, value in self.model_dump(mode="json").items():
            if value is None:
                if type(self).model_fields[name].default is not None:
                    env[f"TOCSIN_{name.upper()}"] = "null"  # unset where the default is a value: the child unsets it
                continue
            secret = getattr(self, name)
            if isinstance(secret, SecretStr):
                value = secret.get_secret_value()
            env[f"TOCSIN_{name.upper()}"] = json.dumps(value) if isinstance(value, list | dict) else str(value)
        return env

    @property
    def deployment(self) -> str:
        """This deployment's id: the setting, else the one its database was created with (read once)."""
        if self.deployment_id is None:
            from subscriptions.db import deployment_id

            self.deployment_id = deployment_id(self.database_url)  # children configured from here inherit it
        return self.deployment_id

    def redis_key(self, *parts: str | int) -> str:
        """Namespaced Redis key: ``<prefix>:<deployment>:part:part``, so deployments sharing a Redis never meet."""
        return ":".join([self.redis_prefix, self.deployment, *map(str, parts)])


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")  # hdfs://nn:8020/x, s3a://b/x, file:///x, file:/x


def checkpoint_location(value: str | Path) -> str:
    """A URI (``scheme:/...``) as it is, for Spark's Hadoop to resolve; a plain path made absolute, once, so the
    driver and its executors (whose working directories differ) and every later start name the same directory."""
    text = str(value).strip()
    if not text:
        raise ValueError("must be a path or a URI (file://, hdfs://, s3a:// ...), not empty")
    if _SCHEME.match(text):
        return text
    return os.path.abspath(os.path.expanduser(text))


def local_path(location: str) -> Path | None:
    """``location`` as a path of this host: a plain path, or a ``file:`` URI without a host (or localhost)."""
    if not _SCHEME.match(location):
        return Path(location)
    scheme, _, rest = location.partition(":")
    if scheme.lower() != "file":
        return None
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
        return Path("/" + path) if host in ("", "localhost") else None
    return Path(rest)


@lru_cache
def get_settings() -> Settings:
    return Settings()
