"""A Celery worker serving one delivery lane: ``python -m notifier.worker --lane tests --concurrency 2``.

The lane's queue name comes from the settings (it is namespaced like every Redis
key), so callers name the lane, not the queue; other options go to Celery.
"""

from __future__ import annotations

import sys

import click

from core import cli
from core.redis_schema import LANES, lane_queue
from core.settings import get_settings
from notifier.app import app


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__, "python -m notifier.worker")
    parser.add_argument("--lane", choices=[*LANES, "all"], default="all")
    args, celery_args = parser.parse_known_args(argv)
    lanes = LANES if args.lane == "all" else (args.lane,)
    queues = ",".join(lane_queue(get_settings(), lane) for lane in lanes)
    if args.lane == "tests":
        app.conf.tocsin_metrics_port = 0
    try:
        app.worker_main(["worker", "-Q", queues, *celery_args])
    except click.UsageError as exc:  # an option neither we nor Celery know: refused like ours (exit 2)
        parser.error(exc.format_message())


if __name__ == "__main__":
    main(sys.argv[1:])
