"""The FastAPI application: JSON API, HTML pages, health, metrics, and the operators' sampler."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import redis
import sqlalchemy.exc
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import Histogram
from starlette.middleware.base import RequestResponseEndpoint

from core.redis_client import make_redis
from core.redis_outage import Outage, is_transient
from core.settings import Settings, get_settings
from notifier.app import make_celery
from subscriptions.errors import Conflict, FieldError, Forbidden, NotFound
from subscriptions.language import ConditionError
from subscriptions.service import CatalogPublisher
from web import pages
from web.api import auth, backtests, dead_letters, endpoints, health, ops, preview, silences, streams, subscriptions
from web.deps import SESSION_COOKIE, web_sessions
from web.limits import STORE_DOWN, BodySizeLimit, RateLimiter, unavailable
from web.ops import run_sampler, wait_for_probe
from web.pages.common import http_error as page_or_json_error
from web.tenants import AccountBound, AccountConcurrency, database_busy

STATIC = Path(__file__).parent / "static"
REQUEST_SECONDS = Histogram("tocsin_http_request_seconds", "Web requests by route template and status",
                            ["method", "route", "status"])


class _AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: a 422 echoes the input, which may hold a lone
    surrogate (``"\\ud800"`` in the request's JSON) that UTF-8 cannot encode (it was a 500)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _field_error(field: str, message: str) -> JSONResponse:
    """The shape of FastAPI's own 422s, so clients handle one kind of validation error."""
    return JSONResponse(status_code=422, content={"detail": [
        {"type": "value_error", "loc": ["body", field], "msg": message, "input": None}]})


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = make_redis(settings, decode_responses=True)
        # Redis down: readiness reports it, and the catalog is published again on the next change.
        with web_sessions(settings)() as session, suppress(redis.RedisError):
            CatalogPublisher(session, settings, app.state.redis).republish()
        sampler = asyncio.create_task(run_sampler(settings, app.state.redis, app.state.celery))
        yield
        sampler.cancel()
        with suppress(asyncio.CancelledError):
            await sampler
        wait_for_probe()
        app.state.redis.close()
        await app.state.account_bound.aclose()

    app = FastAPI(title="Tocsin", version="0.1.0", lifespan=lifespan,
                  description="Alerts on sliding-window aggregates of keyed event streams. Authenticate with "
                              "`Authorization: Bearer <API token>` (`POST /api/auth/token` makes one).")
    app.state.settings = settings
    app.state.redis_outage = Outage("web", settings)
    app.state.limiter = RateLimiter(settings)
    app.add_middleware(BodySizeLimit, max_bytes=settings.request_max_bytes, timeout_s=settings.request_body_timeout_s)
    app.state.account_bound = AccountBound(settings, SESSION_COOKIE)
    app.add_middleware(AccountConcurrency, bound=app.state.account_bound, refuse=page_or_json_error,
                       exempt=("/static/",))  # outside the body limit: a refused request's body is never read
    app.state.celery = make_celery(settings)  # to enqueue test alerts and replays on this deployment's queue
    for router in (auth.router, subscriptions.router, preview.router, backtests.router, endpoints.router, dead_letters.router,
                   ops.router, health.router, pages.router, silences.router, streams.router, streams.tokens_router,
                   streams.publish_router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.middleware("http")
    async def measure(request: Request, call_next: RequestResponseEndpoint) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        REQUEST_SECONDS.labels(request.method, getattr(route, "path", "unmatched"), str(response.status_code)
                               ).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _AsciiJSONResponse(status_code=422, content={"detail": jsonable_encoder(exc.errors())})

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(Conflict)
    async def conflict(_request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.exception_handler(Forbidden)
    async def forbidden(_request: Request, exc: Forbidden) -> JSONResponse:
        return JSONResponse(status_code=403, content={"detail": str(exc)})

    @app.exception_handler(FieldError)
    async def field_error(_request: Request, exc: FieldError) -> JSONResponse:
        return _field_error(exc.field, str(exc))

    @app.exception_handler(ConditionError)
    async def bad_condition(_request: Request, exc: ConditionError) -> JSONResponse:
        return _field_error("condition", str(exc))

    async def store_down(request: Request, exc: Exception) -> Response:
        if is_transient(exc):  # a node lost, a failover: logged once per outage; /readyz says when it is over
            app.state.redis_outage.failed(exc)
        return await page_or_json_error(request, unavailable())

    for error in STORE_DOWN:
        app.add_exception_handler(error, store_down)

    @app.exception_handler(redis.exceptions.RedisClusterException)  # not a RedisError: no cluster node answers
    async def cluster_unreachable(request: Request, exc: redis.exceptions.RedisClusterException) -> Response:
        if not is_transient(exc):  # a cross-slot call: a bug, a 500 with its traceback
            raise exc
        return await store_down(request, exc)

    @app.exception_handler(sqlalchemy.exc.TimeoutError)  # the pool had no connection free: 503, never a 500
    async def database_is_busy(request: Request, _exc: sqlalchemy.exc.TimeoutError) -> Response:
        return await page_or_json_error(request, database_busy(settings))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return await page_or_json_error(request, exc)

    return app
