"""ASGI entry point: ``uvicorn web.main:app``."""

from core.logs import configure_logging
from web.app import create_app

configure_logging()
app = create_app()
