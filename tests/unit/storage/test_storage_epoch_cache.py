"""LeaderEpochFileCache: assign, KIP-279 end offsets, truncation, the checkpoint file."""
from __future__ import annotations

import pytest

from replikafka.broker.storage import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, EpochEntry, LeaderEpochFileCache
from replikafka.errors import StorageError

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_with(tmp_path, *entries) -> LeaderEpochFileCache:
    cache = LeaderEpochFileCache(str(tmp_path / "leader-epoch-checkpoint"))
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def test_assign_keeps_increasing_epochs_only(tmp_path):
    cache = cache_with(tmp_path)
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.assign(1, 0)
    assert not cache.assign(1, 10)        # same epoch again
    assert not cache.assign(0, 20)        # older epoch
    assert not cache.assign(-1, 30)       # undefined epoch
    assert cache.assign(3, 25)
    assert cache.entries() == [EpochEntry(1, 0), EpochEntry(3, 25)]
    assert cache.latest_epoch == 3


def test_a_newer_epoch_starting_lower_replaces_conflicting_entries(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (2, 50), (3, 80))
    cache.assign(4, 60)
    assert cache.entries() == [EpochEntry(1, 0), EpochEntry(2, 50), EpochEntry(4, 60)]


def test_file_format_and_reload(tmp_path):
    cache = cache_with(tmp_path, (0, 0), (2, 17), (5, 300))
    cache.flush()
    assert open(cache.path).read() == "0\n3\n0 0\n2 17\n5 300\n"
    again = LeaderEpochFileCache(cache.path)
    assert again.entries() == cache.entries()


@pytest.mark.parametrize("content", ["", "1\n0\n", "0\n2\n1 0\n", "0\n1\nx y\n", "0\n2\n3 10\n2 20\n"])
def test_malformed_checkpoint_is_refused(tmp_path, content):
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(content)
    with pytest.raises(StorageError, match="leader-epoch"):
        LeaderEpochFileCache(str(path))


# Epochs 1@0, 3@20, 5@50, log end 70.
@pytest.mark.parametrize("requested,expected", [
    (5, (5, 70)),           # the latest epoch ends at the log end
    (3, (3, 50)),           # ends where the next higher epoch starts
    (4, (3, 50)),           # unknown epoch between: the largest epoch below it
    (2, (1, 20)),
    (1, (1, 20)),
    (0, (0, 0)),            # below every epoch: (requested, start of the first higher)
    (6, UNDEFINED),         # above every known epoch
    (UNDEFINED_EPOCH, UNDEFINED),
])
def test_end_offset_for_follows_kip_279(tmp_path, requested, expected):
    cache = cache_with(tmp_path, (1, 0), (3, 20), (5, 50))
    assert cache.end_offset_for(requested, log_end_offset=70) == expected


def test_end_offset_for_on_an_empty_cache(tmp_path):
    assert cache_with(tmp_path).end_offset_for(3, 100) == UNDEFINED


def test_truncate_from_end(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 20), (5, 50))
    cache.truncate_from_end(50)
    assert cache.entries() == [EpochEntry(1, 0), EpochEntry(3, 20)]
    cache.truncate_from_end(21)
    assert cache.entries() == [EpochEntry(1, 0), EpochEntry(3, 20)]
    cache.truncate_from_end(0)
    assert cache.entries() == []
    assert LeaderEpochFileCache(cache.path).entries() == []


def test_truncate_from_start_moves_the_epoch_holding_the_new_start(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 20), (5, 50))
    cache.truncate_from_start(10)
    assert cache.entries() == [EpochEntry(1, 10), EpochEntry(3, 20), EpochEntry(5, 50)]
    cache.truncate_from_start(35)
    assert cache.entries() == [EpochEntry(3, 35), EpochEntry(5, 50)]
    cache.truncate_from_start(50)
    assert cache.entries() == [EpochEntry(5, 50)]
    cache.truncate_from_start(5)      # below the first entry: nothing to do
    assert LeaderEpochFileCache(cache.path).entries() == [EpochEntry(5, 50)]


def test_epoch_for_offset_and_clear(tmp_path):
    cache = cache_with(tmp_path, (1, 10), (3, 20))
    assert [cache.epoch_for_offset(o) for o in (5, 10, 19, 20, 99)] == [-1, 1, 1, 3, 3]
    cache.clear()
    assert cache.entries() == [] and open(cache.path).read() == "0\n0\n"


def test_assign_defers_the_write_until_flush(tmp_path):
    """Becoming leader of thousands of partitions must not fsync each: assign
    only marks the cache dirty; Log.flush writes it before the recovery point moves."""
    cache = LeaderEpochFileCache(str(tmp_path / "leader-epoch-checkpoint"))
    cache.assign(3, 10)
    assert LeaderEpochFileCache(cache.path).entries() == []
    cache.flush()
    assert [(e.epoch, e.start_offset) for e in LeaderEpochFileCache(cache.path).entries()] == [(3, 10)]
