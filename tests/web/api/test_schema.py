"""Schemathesis against the OpenAPI spec: generated requests, valid and not, never get a 500.

Requests are made as an operator with an API token, so every route is reached, on
SQLite and PostgreSQL. The condition preview answers at once here: no evaluator runs.
"""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from core.settings import Settings
from ingest.kafka import ensure_topics
from tests.examples import examples
from tests.users import evaluator_running, new_user
from web.app import create_app

EXAMPLES_PER_OPERATION = examples(30)


def test_no_request_makes_a_server_error(settings: Settings) -> None:
    ensure_topics(settings)  # so that /readyz is ready: its 503 is the one deliberate 5xx
    evaluator_running(settings)
    _, token = new_user(settings, role="operator")
    app = create_app(settings.model_copy(update={"preview_timeout_s": 0.2, "evaluator_stale_s": 86_400}))
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(app):  # runs the app's lifespan (Redis client, catalog) while schemathesis calls it
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) > 30, "every route is in the spec"
        for operation in operations:
            @given(case=operation.as_strategy())
            @hypothesis_settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                                 suppress_health_check=list(HealthCheck))
            def no_server_error(case) -> None:
                response = case.call(headers=headers)
                assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text)

            no_server_error()
