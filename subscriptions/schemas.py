"""API shapes for subscriptions and endpoints, validated with field-level messages."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator, model_validator

from ingest.model import Key
from subscriptions.language import parse_condition

Name = Annotated[str, Field(min_length=1, max_length=200)]


class EndpointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["webhook"]
    target: str = Field(min_length=3, max_length=2048, description="webhook URL")
    secret: str | None = Field(None, min_length=16, max_length=128, description="webhook signing secret")

    @model_validator(mode="after")
    def _check_target(self) -> EndpointIn:
        url = AnyHttpUrl(self.target)
        if url.scheme not in {"http", "https"}:
            raise ValueError("webhook target must be an http(s) URL")
        return self


class EndpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    target: str
    created_at: datetime


class EndpointCreated(EndpointOut):
    secret: str | None = Field(description="shown once: store it to verify webhook signatures")


class SubscriptionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    condition: str = Field(min_length=1, max_length=500, examples=["SUM(volume) OVER 5m > 2e6"])
    keys: list[Key] | None = Field(None, max_length=10_000, description="keys to watch; null for every key")
    endpoint_ids: list[int] = Field(default_factory=list, max_length=20)
    active: bool = True

    @field_validator("condition")
    @classmethod
    def _parses(cls, text: str) -> str:
        parse_condition(text)  # ConditionError is a ValueError: reported on this field
        return text

    @field_validator("keys")
    @classmethod
    def _unique_keys(cls, keys: list[str] | None) -> list[str] | None:
        return sorted(set(keys)) if keys is not None else None


class SubscriptionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    condition: str
    keys: list[str] | None
    active: bool
    endpoint_ids: list[int]
    created_at: datetime
    updated_at: datetime
