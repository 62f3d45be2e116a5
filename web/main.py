"""ASGI entry point: ``uvicorn web.main:app``."""

from infra.logs import configure_logging
from web.app import create_app

configure_logging()
app = create_app()
