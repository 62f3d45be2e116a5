"""The web UI: server-rendered pages (Jinja2) made live with htmx, on the same services as the JSON API.

One module per area, as ``web.api`` has one per resource; ``common`` holds what they share
(templates, the signed-in principal, rendering, error pages, the flash). ``router`` gathers them.
"""

from fastapi import APIRouter

from web.pages import account, auth, backtests, conditions, endpoints, ops, silences, streams, subscriptions

router = APIRouter(include_in_schema=False)
for _area in (auth, subscriptions, conditions, backtests, endpoints, silences, account, ops, streams):
    router.include_router(_area.router)
