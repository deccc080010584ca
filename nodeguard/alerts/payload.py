"""The Alertmanager webhook payload, version 4, as a pydantic model with every field bounded.

The fields read (Alertmanager's webhook ``Message``, notify/webhook/webhook.go: ``version`` and
its ``template.Data``: ``status``, ``receiver``, ``alerts[]`` with ``status``, ``labels``,
``annotations``, ``startsAt``, ``endsAt``, ``fingerprint``); unknown fields are ignored. Every
string and mapping is bounded (:data:`LIMITS`), so what one delivery costs is bounded in bytes.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

__all__ = ["LIMITS", "WebhookAlert", "WebhookPayload"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# RFC 3339 section 5.6 date-time: full-date "T" full-time, the zone required.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")

#: Bounds of the fields of an alert, in characters (and entries). Alertmanager's fingerprints
#: are 16 hex digits and its times 20-35 characters; labels and annotations are Prometheus's,
#: which sets no limit of its own, so these are generous.
LIMITS = {
    "fingerprint": 64,
    "time": 64,
    "labels": 64,
    "label_name": 128,
    "label_value": 1024,
    "annotations": 64,
    "annotation_value": 8192,
    "text": 256,  # status, receiver
}


def _unicode(value: str) -> str:
    """Text that UTF-8 can write: JSON's ``"\\ud800"`` escape gives a lone surrogate, which
    every later encode (an incident id, an API request, a log line) would fail on."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not Unicode text (a lone surrogate)") from None
    return value


_Unicode = AfterValidator(_unicode)
Fingerprint = Annotated[
    str, StringConstraints(min_length=1, max_length=LIMITS["fingerprint"]), _Unicode
]
Time = Annotated[str, StringConstraints(max_length=LIMITS["time"]), _Unicode]
LabelName = Annotated[str, StringConstraints(max_length=LIMITS["label_name"]), _Unicode]
LabelValue = Annotated[str, StringConstraints(max_length=LIMITS["label_value"]), _Unicode]
AnnotationValue = Annotated[str, StringConstraints(max_length=LIMITS["annotation_value"]), _Unicode]
Text = Annotated[str, StringConstraints(max_length=LIMITS["text"]), _Unicode]


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class WebhookAlert(_Loose):
    """One alert of a delivery (Alertmanager's webhook payload, ``alerts[]``). ``startsAt``
    must be an RFC 3339 time with a zone (pydantic parses it; beyond microseconds the digits
    are dropped): it is half of the alert instance's identity."""

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, LabelValue] = Field(max_length=LIMITS["labels"])
    annotations: dict[LabelName, AnnotationValue] = Field(
        default_factory=dict, max_length=LIMITS["annotations"]
    )
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: Time = Field(default="", alias="endsAt")
    fingerprint: Fingerprint

    @field_validator("starts_at", mode="wrap")
    @classmethod
    def _rfc3339(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> dt.datetime:
        if isinstance(value, str) and len(value) > LIMITS["time"]:
            raise ValueError(f"longer than {LIMITS['time']} characters")
        if not isinstance(value, str) or not _RFC3339.fullmatch(value):
            # pydantic also takes Unix times and dates without a zone: not Alertmanager's.
            raise ValueError(f"not an RFC 3339 time with a zone: {str(value)[:64]!r}")
        try:
            parsed: dt.datetime = handler(value)
        except ValidationError:
            raise ValueError(f"not an RFC 3339 time with a zone: {str(value)[:64]!r}") from None
        return parsed

    @property
    def instant(self) -> int:
        """``startsAt`` as integer microseconds since the epoch, whatever its notation."""
        return (self.starts_at - _EPOCH) // dt.timedelta(microseconds=1)


class WebhookPayload(_Loose):
    """The delivery: version ``"4"`` and its alerts; group fields are not needed."""

    version: Literal["4"]
    status: Text = ""
    receiver: Text = ""
    alerts: list[WebhookAlert]
