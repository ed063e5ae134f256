"""The state-change log: a batch of transitions is one record, one entry per line in the file."""
from __future__ import annotations

import io
import logging

from replikafka.broker import state_change_log as S
from replikafka.cli import state_change_log_merger_cmd as M


def _logger_to(stream):
    handler = logging.StreamHandler(stream)
    handler.setFormatter(S.StateChangeFormatter())
    S.state_log.addHandler(handler)
    old_level, old_propagate = S.state_log.level, S.state_log.propagate
    S.state_log.setLevel(logging.INFO)
    S.state_log.propagate = False
    return handler, old_level, old_propagate


def test_every_line_of_a_batch_is_its_own_entry():
    out = io.StringIO()
    handler, level, propagate = _logger_to(out)
    try:
        S.log_lines([f"broker 2: t-{p} becomes LEADER epoch 3 isr [2] (controller epoch 1)" for p in range(3)])
        S.log_lines([])                                   # nothing: no record
        S.state_log.info("broker 2: t-9 StopReplica delete=%s (controller epoch %d)", True, 1)
    finally:
        S.state_log.removeHandler(handler)
        S.state_log.setLevel(level)
        S.state_log.propagate = propagate
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert all(M.ENTRY_LINE.match(line) for line in lines)
    entries = list(M.read_entries(lines))
    assert [e.lines[0].split("INFO ", 1)[1] for e in entries] == [
        "broker 2: t-0 becomes LEADER epoch 3 isr [2] (controller epoch 1)",
        "broker 2: t-1 becomes LEADER epoch 3 isr [2] (controller epoch 1)",
        "broker 2: t-2 becomes LEADER epoch 3 isr [2] (controller epoch 1)",
        "broker 2: t-9 StopReplica delete=True (controller epoch 1)"]
    assert len({e.time for e in entries[:3]}) == 1        # one record: one time


def test_a_traceback_still_continues_its_entry():
    out = io.StringIO()
    handler, level, propagate = _logger_to(out)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            S.state_log.exception("controller 1 epoch 2: t-0 write failed")
    finally:
        S.state_log.removeHandler(handler)
        S.state_log.setLevel(level)
        S.state_log.propagate = propagate
    entries = list(M.read_entries(out.getvalue().splitlines()))
    assert len(entries) == 1 and "ValueError: boom" in entries[0].lines[-1]
