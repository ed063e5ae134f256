"""One error tree for the whole system.

Every error has a stable ``code`` (Kafka's name where Kafka has one) and a
``retriable`` flag. Clients retry retriable errors themselves within a deadline.
The mapping to gRPC status codes lives only in the RPC layer
(:mod:`replikafka.protocol.rpc_errors`).
"""
from __future__ import annotations


class ReplikafkaError(Exception):
    """Root of every error replikafka raises."""

    code = "UNKNOWN_SERVER_ERROR"
    retriable = False

    def __init__(self, message: str = "", *, code: str | None = None, retriable: bool | None = None):
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message = message or (self.__class__.__doc__ or self.code).strip()
        if code is not None:
            self.code = code
        if retriable is not None:
            self.retriable = retriable

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class RetriableError(ReplikafkaError):
    """A transient condition; the same request may succeed later."""

    retriable = True


# ---- retriable -----------------------------------------------------------
class NotLeaderOrFollowerError(RetriableError):
    """This broker is not the leader (or a follower) of the partition."""
    code = "NOT_LEADER_OR_FOLLOWER"


class LeaderNotAvailableError(RetriableError):
    """The partition has no live leader right now."""
    code = "LEADER_NOT_AVAILABLE"


class NotEnoughReplicasError(RetriableError):
    """The in-sync replica set is smaller than min.insync.replicas."""
    code = "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppendError(RetriableError):
    """Appended on the leader, but the ISR shrank below min.insync.replicas before it committed."""
    code = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class RequestTimedOutError(RetriableError):
    """The request did not complete within its timeout."""
    code = "REQUEST_TIMED_OUT"


class FencedLeaderEpochError(RetriableError):
    """The request carried an older leader epoch than the broker's."""
    code = "FENCED_LEADER_EPOCH"


class UnknownLeaderEpochError(RetriableError):
    """The request carried a newer leader epoch than the broker knows."""
    code = "UNKNOWN_LEADER_EPOCH"


class UnknownTopicOrPartitionError(RetriableError):
    """The topic or partition does not exist (or is not known to this broker yet)."""
    code = "UNKNOWN_TOPIC_OR_PARTITION"


class OffsetNotAvailableError(RetriableError):
    """A new leader's high watermark has not reached the start of its epoch yet (KIP-207):
    it cannot tell the latest committed offset; ask again shortly."""
    code = "OFFSET_NOT_AVAILABLE"


class NotControllerError(RetriableError):
    """This broker is not the controller."""
    code = "NOT_CONTROLLER"


class BrokerNotAvailableError(RetriableError):
    """The broker cannot be reached."""
    code = "BROKER_NOT_AVAILABLE"


class StorageError(RetriableError):
    """The log directory failed an I/O operation."""
    code = "KAFKA_STORAGE_ERROR"


class CorruptRecordError(RetriableError):
    """A record batch failed its CRC or could not be parsed."""
    code = "CORRUPT_MESSAGE"


class FetchSessionIdNotFoundError(RetriableError):
    """An incremental fetch named a fetch session the leader does not hold (evicted,
    closed, or the leader restarted): the follower starts over with a full fetch (KIP-227)."""
    code = "FETCH_SESSION_ID_NOT_FOUND"


class InvalidFetchSessionEpochError(RetriableError):
    """An incremental fetch's session epoch is not the one the leader expects (a lost
    or repeated request): the follower starts over with a full fetch (KIP-227)."""
    code = "INVALID_FETCH_SESSION_EPOCH"


# ---- not retriable ---------------------------------------------------------
class OffsetOutOfRangeError(ReplikafkaError):
    """The requested offset is below the log start offset or beyond the log end offset."""
    code = "OFFSET_OUT_OF_RANGE"


class InvalidTopicError(ReplikafkaError):
    """The topic name is not legal."""
    code = "INVALID_TOPIC_EXCEPTION"


class TopicExistsError(ReplikafkaError):
    """A topic with this name already exists."""
    code = "TOPIC_ALREADY_EXISTS"


class InvalidPartitionsError(ReplikafkaError):
    """The number of partitions is not legal."""
    code = "INVALID_PARTITIONS"


class InvalidReplicationFactorError(ReplikafkaError):
    """The replication factor is not legal (or larger than the live brokers)."""
    code = "INVALID_REPLICATION_FACTOR"


class InvalidSchemaError(ReplikafkaError):
    """The records do not match the topic's schema, or the schema itself is not legal."""
    code = "INVALID_RECORD"


class RecordTooLargeError(ReplikafkaError):
    """The batch is larger than message.max.bytes / max.message.bytes."""
    code = "MESSAGE_TOO_LARGE"


class InvalidRequestError(ReplikafkaError):
    """The request is malformed."""
    code = "INVALID_REQUEST"


class InvalidConfigError(ReplikafkaError):
    """A configuration key is unknown or its value is not legal."""
    code = "INVALID_CONFIG"


class StaleControllerEpochError(ReplikafkaError):
    """The request came from a controller with an older epoch than one already seen."""
    code = "STALE_CONTROLLER_EPOCH"


class TopicDeletionDisabledError(ReplikafkaError):
    """delete.topic.enable is false."""
    code = "TOPIC_DELETION_DISABLED"


class StaleBrokerEpochError(ReplikafkaError):
    """A request from an older incarnation of a broker (its registration changed)."""
    code = "STALE_BROKER_EPOCH"


class ReassignmentInProgressError(ReplikafkaError):
    """A partition reassignment is already running (/admin/reassign_partitions exists)."""
    code = "REASSIGNMENT_IN_PROGRESS"


class ElectionInProgressError(ReplikafkaError):
    """A preferred replica election is already running."""
    code = "PREFERRED_LEADER_ELECTION_IN_PROGRESS"


class OutOfOrderSequenceError(ReplikafkaError):
    """The idempotent producer's sequence number is out of order."""
    code = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(ReplikafkaError):
    """The producer's epoch is older than the broker's."""
    code = "INVALID_PRODUCER_EPOCH"


class InvalidOffsetError(ReplikafkaError):
    """The offset is not legal for this request."""
    code = "INVALID_OFFSET"


class AuthorizationError(ReplikafkaError):
    """The principal is not allowed to do this (an ACL refused it); nothing was changed."""
    code = "AUTHORIZATION_FAILED"


class TopicAuthorizationFailedError(AuthorizationError):
    """The principal may not do this operation on the topic."""
    code = "TOPIC_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(AuthorizationError):
    """The principal may not do this operation on the cluster (ClusterAction is for brokers)."""
    code = "CLUSTER_AUTHORIZATION_FAILED"


class AuthenticationError(ReplikafkaError):
    """The connection or the request could not be authenticated."""
    code = "AUTHENTICATION_FAILED"


class SaslAuthenticationFailedError(AuthenticationError):
    """The username or password is wrong, or the mechanism is not enabled on this listener."""
    code = "SASL_AUTHENTICATION_FAILED"


class SslAuthenticationError(AuthenticationError):
    """The TLS handshake failed (certificate not trusted, expired, or TLS spoken to a plaintext port)."""
    code = "SSL_AUTHENTICATION_FAILED"


class CommandError(ReplikafkaError):
    """A local command failed on this machine, not in a server (a process that
    would not start, a cluster directory in use, a missing file)."""
    code = "COMMAND_ERROR"


class IllegalStateTransitionError(ReplikafkaError):
    """The controller tried to move a partition or replica along a transition its state
    machine does not allow (a bug in the controller's bookkeeping)."""
    code = "ILLEGAL_STATE"

    def __init__(self, message: str = "", *, key=None, from_state=None, to_state=None, recent_events=()):
        super().__init__(message)
        self.key, self.from_state, self.to_state = key, from_state, to_state
        self.recent_events = tuple(recent_events)


class KafkaTimeoutError(ReplikafkaError):
    """The client gave up after retrying within its deadline."""
    code = "TIMEOUT"


_ALL = [obj for obj in list(globals().values())
        if isinstance(obj, type) and issubclass(obj, ReplikafkaError)]
_BY_CODE: dict[str, type[ReplikafkaError]] = {}
for _cls in _ALL:
    _BY_CODE.setdefault(_cls.code, _cls)


def error_for_code(code: str, message: str = "") -> ReplikafkaError:
    """Rebuild the right exception class from a wire error code."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return ReplikafkaError(message, code=code)
    return cls(message)


__all__ = [c.__name__ for c in _ALL] + ["error_for_code"]
