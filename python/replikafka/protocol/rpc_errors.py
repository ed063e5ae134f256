"""The only place where the error tree meets gRPC.

Per-partition outcomes travel in an ``Error`` field of the response (Kafka
style); a request that cannot be handled at all fails with a gRPC status whose
details are ``"<CODE>: <message>"``.
"""
from __future__ import annotations

import grpc

from replikafka import errors as E
from replikafka.protocol import replikafka_pb2 as pb

_STATUS_FOR_CODE = {
    E.InvalidRequestError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidConfigError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidTopicError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidSchemaError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidPartitionsError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.InvalidReplicationFactorError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.RecordTooLargeError.code: grpc.StatusCode.INVALID_ARGUMENT,
    E.UnknownTopicOrPartitionError.code: grpc.StatusCode.NOT_FOUND,
    E.TopicExistsError.code: grpc.StatusCode.ALREADY_EXISTS,
    E.RequestTimedOutError.code: grpc.StatusCode.DEADLINE_EXCEEDED,
    E.StaleControllerEpochError.code: grpc.StatusCode.FAILED_PRECONDITION,
    E.NotControllerError.code: grpc.StatusCode.FAILED_PRECONDITION,
    E.TopicDeletionDisabledError.code: grpc.StatusCode.FAILED_PRECONDITION,
    E.AuthorizationError.code: grpc.StatusCode.PERMISSION_DENIED,
    E.TopicAuthorizationFailedError.code: grpc.StatusCode.PERMISSION_DENIED,
    E.ClusterAuthorizationFailedError.code: grpc.StatusCode.PERMISSION_DENIED,
    E.AuthenticationError.code: grpc.StatusCode.UNAUTHENTICATED,
    E.SaslAuthenticationFailedError.code: grpc.StatusCode.UNAUTHENTICATED,
    E.SslAuthenticationError.code: grpc.StatusCode.UNAUTHENTICATED,
}

OK = pb.Error()


def to_pb(exc: E.ReplikafkaError | None) -> pb.Error:
    if exc is None:
        return OK
    return pb.Error(code=exc.code, message=exc.message)


def from_pb(err: pb.Error) -> E.ReplikafkaError | None:
    if not err.code:
        return None
    return E.error_for_code(err.code, err.message)


def abort(context: grpc.ServicerContext, exc: E.ReplikafkaError):
    """Fail the whole RPC with a status carrying the error code (raises)."""
    status = _STATUS_FOR_CODE.get(exc.code, grpc.StatusCode.UNAVAILABLE if exc.retriable
                                  else grpc.StatusCode.FAILED_PRECONDITION)
    context.abort(status, f"{exc.code}: {exc.message}")


def from_rpc_error(exc: grpc.RpcError, target: str = "") -> E.ReplikafkaError:
    """Turn a failed call into the error tree (client side)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    head, sep, rest = details.partition(": ")
    if sep and head.isupper() and "_" in head or head in ("TIMEOUT",):
        return E.error_for_code(head, rest)
    where = f" ({target})" if target else ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return E.BrokerNotAvailableError(f"broker unavailable{where}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return E.RequestTimedOutError(f"request timed out{where}")
    if code == grpc.StatusCode.CANCELLED:
        return E.BrokerNotAvailableError(f"request cancelled{where}: {details}")
    return E.ReplikafkaError(f"{code.name if code else 'RPC'}{where}: {details}")


# ---- Arrow Flight ------------------------------------------------------------------
# A Flight call fails with a FlightError whose ``extra_info`` is our error code and
# whose message starts "<CODE>: ", so any Flight client shows what went wrong and
# ours maps it back into the error tree (retriable flag kept).
def to_flight_error(exc: E.ReplikafkaError) -> Exception:
    import pyarrow.flight as fl
    cls = fl.FlightUnavailableError if exc.retriable else fl.FlightServerError
    return cls(f"{exc.code}: {exc.message}", exc.code.encode())


def from_flight_error(exc: Exception, target: str = "") -> E.ReplikafkaError:
    """A failed Flight call (client side) as an error of the tree."""
    import pyarrow.flight as fl
    extra = getattr(exc, "extra_info", None) or b""
    code = extra.decode("ascii", "replace") if isinstance(extra, bytes) else ""
    text = str(exc)
    if code and code.isupper():
        head = f"{code}: "
        at = text.find(head)
        message = text[at + len(head):] if at >= 0 else text
        return E.error_for_code(code, message.split(". Detail:")[0].strip())
    head, sep, rest = text.partition(": ")
    if sep and head.isupper() and "_" in head:     # a refusal without extra_info (e.g. authorization)
        return E.error_for_code(head, rest.split(". Detail:")[0].strip())
    where = f" ({target})" if target else ""
    if isinstance(exc, (fl.FlightUnavailableError, fl.FlightCancelledError)):
        return E.BrokerNotAvailableError(f"flight server unavailable{where}: {text}")
    if isinstance(exc, fl.FlightTimedOutError):
        return E.RequestTimedOutError(f"flight request timed out{where}")
    return E.ReplikafkaError(f"flight call failed{where}: {text}")
