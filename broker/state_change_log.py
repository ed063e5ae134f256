"""The state-change log (Kafka's ``state.change.logger``): one line per partition
state transition, written by the controller and by each broker to
``<first log dir>/state-change.log`` and read by ``state-change-log-merger``.

A failover changes thousands of partitions at once, and one ``logging`` call
per partition (a record, a format, a write and a flush per handler) cost more
than the failover itself (10,000 lines: ~1 s of a broker's LeaderAndIsr).
So a batch of transitions is one record whose message holds one line per
partition (:func:`log_lines`), and :class:`StateChangeFormatter` gives every
line its own ``[time] LEVEL`` prefix: the file still has one entry per line.
"""
from __future__ import annotations

import logging

LOGGER_NAME = "replikafka.state.change"
FORMAT = "[%(asctime)s] %(levelname)s %(message)s"

state_log = logging.getLogger(LOGGER_NAME)


def enabled() -> bool:
    return state_log.isEnabledFor(logging.INFO)


def log_lines(lines: list[str]) -> None:
    """Log many state transitions as one record (one line each in the file)."""
    if lines and state_log.isEnabledFor(logging.INFO):
        state_log.info("%s", "\n".join(lines))


class StateChangeFormatter(logging.Formatter):
    """Formats each line of a multi-line record as its own entry (same time and level)."""

    def __init__(self, fmt: str = FORMAT, datefmt: str | None = None):
        super().__init__(fmt, datefmt)

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if "\n" not in message or record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = message
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        out = []
        for line in message.split("\n"):
            record.message = line
            out.append(self.formatMessage(record))
        record.message = message
        return "\n".join(out)
