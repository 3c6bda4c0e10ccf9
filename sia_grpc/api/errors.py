"""Typed errors on both sides of the wire.

The server raises `ApiError` (or a subclass); the gRPC layer turns it into a
status code, a message, and a `google.rpc.Status` carrying `ErrorInfo` (reason,
domain "sia.v1", metadata) and, for a bad field, a `BadRequest` naming it. The
client turns a failed call back into the same `ApiError`, so `err.field` reads
"spec.min_gpus" on both sides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "sia.v1"

# An error travels in trailing metadata, which gRPC caps at 16 KiB by default: a
# message echoing a 20,000-character job id would reach the client as the
# transport's own RESOURCE_EXHAUSTED instead of this error. Echoed text is clipped,
# in UTF-8 bytes (grpc-message percent-encodes each non-ASCII byte as three, and the
# status details carry the message twice more).
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_BYTES = 256


def clip(text: str, limit: int) -> str:
    """`text` if it is at most `limit` bytes of UTF-8, else its head and tail around
    a count of what was cut (the head names the field, the tail often the bound)."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return text
    marker = f"...[{len(text)} chars]..."
    keep = max(limit - len(marker), 0)
    head = keep * 3 // 4
    return (data[:head].decode("utf-8", "ignore") + marker
            + data[len(data) - (keep - head):].decode("utf-8", "ignore"))


@dataclass
class ApiError(Exception):
    """A request failed with `code`; `field` names the request field at fault."""

    code: grpc.StatusCode
    message: str
    field: str = ""
    reason: str = ""  # machine-readable, UPPER_SNAKE_CASE
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.message = clip(self.message, MAX_MESSAGE_BYTES)
        self.field = clip(self.field, MAX_METADATA_BYTES)
        self.metadata = {clip(k, MAX_METADATA_BYTES): clip(v, MAX_METADATA_BYTES)
                         for k, v in self.metadata.items()}
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def to_status(self) -> grpc.Status:
        details = []
        info = error_details_pb2.ErrorInfo(reason=self.reason or self.code.name, domain=DOMAIN,
                                           metadata=self.metadata)
        details.append(_pack(info))
        if self.field:
            details.append(_pack(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=self.field,
                                                            description=self.message)])))
        return rpc_status.to_status(status_pb2.Status(
            code=getattr(code_pb2, self.code.name), message=self.message, details=details))

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> ApiError:
        """The typed error behind a failed call (sync or aio)."""
        code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
        message = err.details() if callable(getattr(err, "details", None)) else str(err)
        out = cls(code, message or code.name)
        status = _status_of(err)
        if status is None:
            return out
        for any_ in status.details:
            if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                out.reason, out.metadata = info.reason, dict(info.metadata)
            elif any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                any_.Unpack(bad)
                if bad.field_violations:
                    out.field = bad.field_violations[0].field
        return out


def invalid(field_path: str, message: str) -> ApiError:
    """INVALID_ARGUMENT naming the field: `invalid("spec.min_gpus", "must be >= 1")`."""
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"{field_path}: {message}",
                    field=field_path, reason="INVALID_FIELD")


def not_found(what: str, name: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, f"{what} {name!r} not found",
                    reason=f"{what.upper()}_NOT_FOUND", metadata={what: name})


def already_exists(what: str, name: str, message: str = "") -> ApiError:
    return ApiError(grpc.StatusCode.ALREADY_EXISTS, message or f"{what} {name!r} already exists",
                    reason=f"{what.upper()}_EXISTS", metadata={what: name})


def failed_precondition(message: str, reason: str = "FAILED_PRECONDITION") -> ApiError:
    return ApiError(grpc.StatusCode.FAILED_PRECONDITION, message, reason=reason)


def unavailable(message: str, reason: str = "UNAVAILABLE") -> ApiError:
    return ApiError(grpc.StatusCode.UNAVAILABLE, message, reason=reason)


def unauthenticated(message: str, reason: str = "UNAUTHENTICATED") -> ApiError:
    """UNAUTHENTICATED: no credentials, or credentials the controller does not accept."""
    return ApiError(grpc.StatusCode.UNAUTHENTICATED, message, reason=reason)


def permission_denied(message: str, reason: str = "PERMISSION_DENIED") -> ApiError:
    """PERMISSION_DENIED: the caller is known but may not do this."""
    return ApiError(grpc.StatusCode.PERMISSION_DENIED, message, reason=reason)


def _pack(msg: Message) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)
    return a


def _status_of(err: grpc.RpcError) -> status_pb2.Status | None:
    # ((key, value) pairs, as grpc_status itself reads them: not the stubs' _Metadatum)
    trailing = cast("tuple[tuple[str, str | bytes], ...]", err.trailing_metadata()
                    if callable(getattr(err, "trailing_metadata", None)) else ())
    for key, value in trailing or ():
        # (grpc_status's own constant, which its stubs leave out)
        if key == rpc_status.GRPC_DETAILS_METADATA_KEY:  # type: ignore[attr-defined]
            return status_pb2.Status.FromString(value)
    return None
