from replikafka.client.partitioner import murmur2, partition_for_key

# Apache Kafka's UtilsTest.testMurmur2 vectors.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafka():
    for data, expected in KAFKA_VECTORS.items():
        assert murmur2(data) == expected, data


def test_partition_for_key_is_kafkas_and_stable():
    assert partition_for_key(b"foobar", 50) == 16
    for n in (1, 3, 7, 100):
        for key in (b"", b"a", b"user-42", bytes(range(200))):
            p = partition_for_key(key, n)
            assert 0 <= p < n
            assert p == partition_for_key(key, n)
    assert partition_for_key("user-42", 12) == partition_for_key(b"user-42", 12)


def test_keys_spread_over_partitions():
    hits = {partition_for_key(f"k{i}".encode(), 8) for i in range(200)}
    assert hits == set(range(8))
