"""A Celery worker serving one lane (alerts, tests or backtests): ``python -m notifier.worker --lane tests --concurrency 2``.

The lane's queue name comes from the settings (it is namespaced like every Redis
key), so callers name the lane, not the queue; other options go to Celery.
"""

from __future__ import annotations

import argparse
import sys

import click
from celery.bin.base import CLIContext
from celery.bin.worker import worker as worker_command

from core import cli
from core.cpu_priority import lower_cpu_priority
from core.redis_schema import LANES, lane_queue
from core.settings import get_settings
from notifier.app import app


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__, "python -m notifier.worker")
    parser.add_argument("--lane", choices=[*LANES, "all"], default="all")
    args, celery_args = parser.parse_known_args(argv)
    _check_celery_options(parser, celery_args)  # before the queue names, which read (or create) the database
    lanes = LANES if args.lane == "all" else (args.lane,)
    queues = ",".join(lane_queue(get_settings(), lane) for lane in lanes)
    if args.lane in ("tests", "backtests"):  # the port is the alert lane's
        app.conf.tocsin_metrics_port = 0
    if args.lane == "backtests":  # live evaluation keeps the cores it needs (the pool's processes inherit it)
        lower_cpu_priority(get_settings().backtest_worker_nice)
    try:
        app.worker_main(["worker", "-Q", queues, *celery_args])
    except click.UsageError as exc:  # an option neither we nor Celery know: refused like ours (exit 2)
        parser.error(exc.format_message())


def _check_celery_options(parser: argparse.ArgumentParser, celery_args: list[str]) -> None:
    """Refuse an option Celery's worker does not take (exit 2, like ours) without starting anything."""
    try:
        worker_command.make_context("worker", ["-Q", "-", *celery_args],
                                    obj=CLIContext(app=app, no_color=True, workdir=None, quiet=True))
    except click.UsageError as exc:
        parser.error(exc.format_message())


if __name__ == "__main__":
    main(sys.argv[1:])
