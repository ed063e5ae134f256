"""log4j-style log levels per logger: ``log.level=INFO`` for the root logger and
``log.level.<logger name>=DEBUG`` for one logger and its children, set in the
broker's properties and changed at runtime over the HTTP port
(``POST /loggers``, Kafka's ``kafka-configs --entity-type broker-loggers``).

Levels are log4j's names; ``TRACE`` maps to DEBUG and ``OFF`` to above CRITICAL.
"""
from __future__ import annotations

import logging

from replikafka.errors import InvalidConfigError

ROOT_KEY = "log.level"
LOGGER_KEY_PREFIX = "log.level."
LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
          "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL,
          "CRITICAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}


def parse_level(name: str) -> int:
    level = LEVELS.get(str(name).strip().upper())
    if level is None:
        raise InvalidConfigError(f"unknown log level {name!r}; allowed: {', '.join(LEVELS)}")
    return level


def set_level(logger_name: str, level_name: str) -> str:
    """Set one logger's level now (``""`` or ``root`` = the root logger); returns the level's name."""
    if not isinstance(logger_name, str) or any(c.isspace() for c in logger_name):
        raise InvalidConfigError(f"invalid logger name {logger_name!r}")
    level = parse_level(level_name)
    logger = logging.getLogger() if logger_name in ("", "root") else logging.getLogger(logger_name)
    logger.setLevel(level)
    return logging.getLevelName(level) if level <= logging.CRITICAL else "OFF"


def apply(config) -> None:
    """The levels a broker config names: the root first, then each logger."""
    set_level("", config.get(ROOT_KEY))
    for name, level in sorted(config.logger_levels().items()):
        set_level(name, level)


def levels() -> dict[str, str]:
    """Every logger with a level set explicitly, and the root."""
    out = {"root": logging.getLevelName(logging.getLogger().level)}
    for name, logger in sorted(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            out[name] = logging.getLevelName(logger.level) if logger.level <= logging.CRITICAL else "OFF"
    return out
