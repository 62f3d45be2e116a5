"""The FastAPI application: API, health, metrics and a small status page."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.templating import Jinja2Templates

from infra.settings import Settings, get_settings
from notifier.app import make_celery
from subscriptions.db import session_factory
from subscriptions.language import ConditionError
from subscriptions.service import NotFound, SubscriptionService
from web.api import dead_letters, endpoints, health, subscriptions
from web.deps import RecordsDep, ServiceDep

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        app.state.redis = redis.Redis.from_url(settings.redis_url, decode_responses=True)
        with session_factory(settings.database_url)() as session:
            try:
                SubscriptionService(session, settings, app.state.redis).republish()
            except redis.RedisError:
                pass  # readiness reports it; the catalog is published again on the next change
        yield
        app.state.redis.close()

    app = FastAPI(title="Tocsin", version="0.1.0", lifespan=lifespan,
                  description="Alerts on sliding-window aggregates of keyed event streams.")
    app.state.settings = settings
    app.state.celery = make_celery(settings)  # to enqueue replayed deliveries on this deployment's queue
    app.include_router(subscriptions.router)
    app.include_router(endpoints.router)
    app.include_router(dead_letters.router)
    app.include_router(health.router)

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(ConditionError)
    async def bad_condition(_request: Request, exc: ConditionError) -> JSONResponse:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("body", "condition"), "msg": str(exc), "input": None}]
        )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request, service: ServiceDep, records: RecordsDep) -> HTMLResponse:
        return TEMPLATES.TemplateResponse(
            request, "index.html", {"subscriptions": service.list(), "dead_letters": records.dead_letters(100)}
        )

    return app
