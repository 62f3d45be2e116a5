"""API shapes for subscriptions and endpoints, validated with field-level messages."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from core.stream_names import TRADES
from core.streams import StreamName
from core.text import Name, plain_text
from ingest.model import Key
from subscriptions.channel_kinds import MAX_KIND_LENGTH, EndpointKind, endpoint_kind, endpoint_kinds
from subscriptions.language import ANY_FIELDS, parse_filtered
from subscriptions.policy import AlertPolicy

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _printable(text: str) -> str:
    """Text users type has no control characters (PostgreSQL refuses NUL; logs and e-mails want none)."""
    if _CONTROL.search(text):
        raise ValueError("must not contain control characters")
    return text


Printable = AfterValidator(_printable)


# The largest id both databases store (PostgreSQL's INTEGER is 32-bit): a larger one is refused, not an overflow.
MAX_ID = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=MAX_ID)]

EMAIL_ADDRESS = re.compile(r"^[^@\s<>,;\x00-\x1f\x7f]+@[^@\s<>,;\x00-\x1f\x7f]+\.[A-Za-z0-9-]{2,}$")


# A ceiling for the request body; the deployment's limit (TOCSIN_TEMPLATE_MAX_CHARS) is checked with the sandbox.
MAX_TEMPLATE_LENGTH = 20_000
Template = Annotated[str | None, Field(max_length=MAX_TEMPLATE_LENGTH, description="message template (Jinja2, "
                                                                                "sandboxed; see docs/notifications.md 'Receivers')"),
                     AfterValidator(lambda text: text if text is not None and text.strip() else None)]  # blank: none


def _kind_names(schema: dict[str, Any]) -> None:
    """The kinds in the API schema, as an enum, read from the registry when the schema is built."""
    schema["enum"] = [kind.name for kind in endpoint_kinds()]


class EndpointIn(BaseModel):
    """An endpoint to create; what its target and secret may be depends on its kind (``channel_kinds``)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(max_length=MAX_KIND_LENGTH, json_schema_extra=_kind_names)
    target: Annotated[str, Field(min_length=3, max_length=2048, description="where to deliver, as the kind "
                                 "expects it: a URL, an address..."), Printable]
    secret: Annotated[str, Printable] | None = Field(None, min_length=16, max_length=128, validate_default=True,
                               description="signing secret of kinds that sign (generated when omitted), or the "
                                           "key a kind requires (a PagerDuty routing key)")
    template: Template = None

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        endpoint_kind(kind)  # UnknownKindError is a ValueError: reported on this field
        return kind

    @field_validator("target")
    @classmethod
    def _check_target(cls, target: str, info: ValidationInfo) -> str:
        if "kind" not in info.data:  # no valid kind: its own error says so
            return target
        return endpoint_kind(info.data["kind"]).check_target(target)

    @field_validator("secret")
    @classmethod
    def _secret_only_if_signed(cls, secret: str | None, info: ValidationInfo) -> str | None:
        if "kind" in info.data:
            kind = endpoint_kind(info.data["kind"])
            if secret is not None and not kind.has_secret:
                raise ValueError(f"{kind.label} endpoints take no secret")
            if secret is None and kind.secret_required:
                raise ValueError(f"{kind.label} endpoints need their {kind.secret_label}")
        return secret

    @field_validator("template")
    @classmethod
    def _template_only_if_used(cls, template: str | None, info: ValidationInfo) -> str | None:
        return _template_for(info.data.get("kind"), template)


def _template_for(kind_name: str | None, template: str | None) -> str | None:
    """A blank template is none; a kind without messages takes none (the sandbox checks it in the service)."""
    if template is None or not template.strip():
        return None
    if kind_name is not None:
        kind = endpoint_kind(kind_name)
        if kind.template_use is None:
            raise ValueError(f"{kind.label} endpoints take no message template")
    return template


class EndpointTemplateIn(BaseModel):
    """A new message template for an endpoint (null or blank: back to the channel's own message)."""

    model_config = ConfigDict(extra="forbid")

    template: Template = None


class TemplatePreviewIn(BaseModel):
    """A template to render against a sample notification, as an endpoint of ``kind`` would send it."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(max_length=MAX_KIND_LENGTH, json_schema_extra=_kind_names)
    template: Template = None
    state: Literal["firing", "resolved"] = "firing"

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        endpoint_kind(kind)
        return kind

    @field_validator("template")
    @classmethod
    def _template_only_if_used(cls, template: str | None, info: ValidationInfo) -> str | None:
        return _template_for(info.data.get("kind"), template)


class TemplatePreviewOut(BaseModel):
    ok: bool
    text: str | None = Field(description="the rendered message (the kind's default message if template is null)")
    error: str | None = None
    line: int | None = Field(None, description="the template line the error is on, when known")
    payload: Any = Field(None, description="what the receiver would get (for PagerDuty: the first event)")


class EndpointKindOut(BaseModel):
    name: str
    label: str
    has_secret: bool
    secret_required: bool
    secret_label: str
    placeholder: str
    help: str
    template_use: str | None = Field(description="what a message template renders for this kind; null: no template")

    @classmethod
    def of(cls, kind: EndpointKind) -> EndpointKindOut:
        return cls(name=kind.name, label=kind.label, has_secret=kind.has_secret, secret_required=kind.secret_required,
                   secret_label=kind.secret_label, placeholder=kind.placeholder, help=kind.help,
                   template_use=kind.template_use)


class EndpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    target: str
    template: str | None = None
    created_at: datetime


class EndpointCreated(EndpointOut):
    secret: str | None = Field(description="shown once: store it to verify the signatures of its deliveries")


class TestFireOut(BaseModel):
    notification_id: str
    endpoint_id: int
    queued: bool


class SubscriptionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    stream: StreamName = Field(TRADES, description="the stream the condition is over (its attributes and "
                                                   "dimensions); trades when omitted")
    condition: str = Field(min_length=1, max_length=500, examples=["SUM(volume) OVER 5m > 2e6",
                                                                   "AVG(cpu) OVER 1m > 90 WHERE region = 'eu'"])
    keys: list[Key] | None = Field(None, min_length=1, max_length=10_000,
                                   description="keys to watch; null for every key. With key IN (...) in the "
                                               "condition, the keys in both")
    endpoint_ids: list[Id] = Field(default_factory=list, max_length=20)
    active: bool = True
    policy: AlertPolicy = Field(default_factory=AlertPolicy)

    @field_validator("condition")
    @classmethod
    def _parses(cls, text: str) -> str:
        # The syntax here (ConditionError is a ValueError: reported on this field, with the others); the
        # stream's attributes and dimensions in the service, which reads the stream's schema.
        parse_filtered(text, ANY_FIELDS)
        return text

    @field_validator("keys")
    @classmethod
    def _unique_keys(cls, keys: list[str] | None) -> list[str] | None:
        return sorted(set(keys)) if keys is not None else None


class SubscriptionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    stream: str
    condition: str
    keys: list[str] | None
    active: bool
    endpoint_ids: list[int]
    policy: AlertPolicy
    created_at: datetime
    updated_at: datetime


class MuteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    until: datetime | None = Field(description="send nothing until this time; null unmutes")


# -- accounts ---------------------------------------------------------------------------------

class Credentials(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str = Field(min_length=3, max_length=320, examples=["ada@example.com"])
    password: str = Field(min_length=1, max_length=4096)

    @field_validator("email")
    @classmethod
    def _address(cls, email: str) -> str:
        email = email.strip().lower()
        if not EMAIL_ADDRESS.match(email) or email != plain_text(email):
            raise ValueError("must be an e-mail address, like ada@example.com")
        return email


PASSWORD_RULES = ("at least 10 characters besides surrounding spaces (TOCSIN_PASSWORD_MIN_LENGTH), at most 256 "
                  "(TOCSIN_PASSWORD_MAX_LENGTH), not the e-mail address")


class SignUpIn(Credentials):
    password: str = Field(min_length=1, max_length=4096, description=PASSWORD_RULES)
    invitation: Annotated[str, Printable] | None = Field(
        None, min_length=1, max_length=100, description="an operator's invitation: grants its role, even when "
                                                         "sign-up is closed")


class PasswordChangeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    current_password: str = Field(min_length=1, max_length=4096)
    new_password: str = Field(min_length=1, max_length=4096, description=PASSWORD_RULES)


class PasswordChanged(BaseModel):
    revoked_sessions: int = Field(description="other browser sessions ended")
    revoked_tokens: int = Field(description="API tokens revoked (all of the account's)")
    detail: str


class InvitationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "operator"] = "user"


class InvitationOut(BaseModel):
    token: str = Field(description="shown once: the invitee signs up with it (single use)")
    role: str
    expires_at: datetime
    signup_url: str = Field(description="the sign-up page with the invitation filled in")


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    email: str
    role: str
    created_at: datetime


class SessionOut(BaseModel):
    user: UserOut
    csrf_token: str = Field(description="send as X-CSRF-Token with every unsafe request made with the cookie")


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="shown once: send it as 'Authorization: Bearer <token>'")


class LoginTokenIn(Credentials):
    name: Name = "api"
