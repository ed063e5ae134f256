"""A broker's glibc malloc keeps freed fetch-sized buffers mapped (broker/malloc_tuning.py)."""
import platform
import subprocess
import sys

import pytest

from replikafka.broker.malloc_tuning import keep_freed_memory

# Fetch-answer-sized buffers (4-7 MB), several alive at once, then all freed, ten
# times over, after one 8 MB buffer set glibc's adaptive thresholds: the page faults
# this pattern takes, in a fresh interpreter, with keep_freed_memory(argv[1]).
_PATTERN = """
import resource, sys
from replikafka.broker.malloc_tuning import keep_freed_memory
applied = keep_freed_memory(int(sys.argv[1]))
src = memoryview(bytes(1 << 20))
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
held = [b"".join([src] * 8)]
held = None
before = faults()
for _ in range(10):
    held = [b"".join([src] * n) for n in (7, 5, 6, 4, 7)]
    held = None
print(applied, faults() - before)
"""


def _faults(trim_threshold_bytes: int) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _PATTERN, str(trim_threshold_bytes)], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting exists only in glibc's malloc")
def test_freed_buffers_are_reused_instead_of_faulted_in_again():
    applied, kept = _faults(64 << 20)
    default_applied, default = _faults(0)
    assert applied and not default_applied
    # glibc's defaults give the 29 MB back after every round (~7,400 pages faulted in
    # again each time); kept, only the first round faults.
    assert kept * 4 < default, (kept, default)


def test_zero_leaves_glibcs_defaults():
    assert keep_freed_memory(0) is False


def test_a_broker_process_takes_the_configured_switch_interval():
    """python.switch.interval.us (default 1 ms) is the process's switch interval once a
    broker starts (server.tune_process); 0 leaves Python's."""
    import sys

    from replikafka.broker.config import BrokerConfig
    from replikafka.broker.server import tune_process
    before = sys.getswitchinterval()
    base = {"broker.id": 1, "zookeeper.connect": "unused:1", "log.dirs": "/nonexistent",
            "malloc.trim.threshold.bytes": "0", **_GC_AS_IS}
    try:
        sys.setswitchinterval(0.005)
        tune_process(BrokerConfig.from_dict(base))
        assert sys.getswitchinterval() == pytest.approx(0.001)
        tune_process(BrokerConfig.from_dict({**base, "python.switch.interval.us": "250"}))
        assert sys.getswitchinterval() == pytest.approx(0.00025)
        sys.setswitchinterval(0.005)
        tune_process(BrokerConfig.from_dict({**base, "python.switch.interval.us": "0"}))
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(before)


#: tune_process settings that leave the test process's garbage collector as it is.
_GC_AS_IS = {"python.gc.generation0.threshold.objects": "0"}


def test_a_broker_process_takes_the_configured_young_collection_threshold():
    """python.gc.generation0.threshold.objects (default 50,000) is the collector's first
    threshold once a broker starts (server.tune_process); 0 leaves Python's."""
    import gc

    from replikafka.broker.config import BrokerConfig
    from replikafka.broker.server import tune_process
    base = {"broker.id": 1, "zookeeper.connect": "unused:1", "log.dirs": "/nonexistent",
            "malloc.trim.threshold.bytes": "0", "python.switch.interval.us": "0"}
    thresholds = gc.get_threshold()
    try:
        gc.set_threshold(700, *thresholds[1:])
        tune_process(BrokerConfig.from_dict({**base, **_GC_AS_IS}))
        assert gc.get_threshold() == (700,) + thresholds[1:]
        tune_process(BrokerConfig.from_dict(base))
        assert gc.get_threshold() == (50_000,) + thresholds[1:]
        tune_process(BrokerConfig.from_dict({**base, "python.gc.generation0.threshold.objects": "2000"}))
        assert gc.get_threshold() == (2000,) + thresholds[1:]
    finally:
        gc.set_threshold(*thresholds)
