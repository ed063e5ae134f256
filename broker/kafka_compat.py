"""Kafka's own broker configuration keys, so a Kafka ``server.properties`` can be reused.

:data:`KAFKA_BROKER_KEYS` holds the names of Kafka's broker configuration (the
``*Prop`` names of Kafka 3.x's ``KafkaConfig``, ZooKeeper mode). A key in it that
replikafka does not implement (``num.network.threads``, ``socket.*``,
``offsets.topic.replication.factor``, ``log.cleaner.enable``, ...) is accepted and
listed once in a warning as ignored, as Kafka does with a key it does not
know; any other unknown key is still refused, with a "did you mean" hint
(:mod:`replikafka.broker.config`). Keys replikafka implements are in its own
table and never reach this list.
"""
from __future__ import annotations

KAFKA_BROKER_KEYS = frozenset("""
zookeeper.connect zookeeper.session.timeout.ms zookeeper.connection.timeout.ms zookeeper.sync.time.ms
zookeeper.set.acl zookeeper.max.in.flight.requests zookeeper.ssl.client.enable zookeeper.clientCnxnSocket
zookeeper.ssl.keystore.location zookeeper.ssl.keystore.password zookeeper.ssl.keystore.type
zookeeper.ssl.truststore.location zookeeper.ssl.truststore.password zookeeper.ssl.truststore.type
zookeeper.ssl.protocol zookeeper.ssl.enabled.protocols zookeeper.ssl.cipher.suites
zookeeper.ssl.endpoint.identification.algorithm zookeeper.ssl.crl.enable zookeeper.ssl.ocsp.enable
broker.id.generation.enable reserved.broker.max.id broker.id message.max.bytes num.network.threads
num.io.threads background.threads num.replica.alter.log.dirs.threads queued.max.requests
queued.max.request.bytes request.timeout.ms socket.connection.setup.timeout.ms
socket.connection.setup.timeout.max.ms
process.roles initial.broker.registration.timeout.ms broker.heartbeat.interval.ms broker.session.timeout.ms
node.id metadata.log.dir metadata.log.max.record.bytes.between.snapshots controller.listener.names
sasl.mechanism.controller.protocol metadata.log.segment.min.bytes metadata.log.segment.bytes
metadata.log.segment.ms metadata.max.retention.bytes metadata.max.retention.ms
controller.quorum.voters controller.quorum.election.timeout.ms controller.quorum.fetch.timeout.ms
controller.quorum.election.backoff.max.ms controller.quorum.append.linger.ms
controller.quorum.request.timeout.ms controller.quorum.retry.backoff.ms
authorizer.class.name listeners advertised.listeners listener.security.protocol.map
control.plane.listener.name socket.send.buffer.bytes socket.receive.buffer.bytes socket.request.max.bytes
socket.listen.backlog.size max.connections.per.ip max.connections.per.ip.overrides max.connections
max.connection.creation.rate connections.max.idle.ms connection.failed.authentication.delay.ms
broker.rack num.partitions log.dirs log.dir log.segment.bytes log.roll.ms log.roll.hours
log.roll.jitter.ms log.roll.jitter.hours log.retention.ms log.retention.minutes log.retention.hours
log.retention.bytes log.retention.check.interval.ms log.cleanup.policy log.cleaner.threads
log.cleaner.io.max.bytes.per.second log.cleaner.dedupe.buffer.size log.cleaner.io.buffer.size
log.cleaner.io.buffer.load.factor log.cleaner.backoff.ms log.cleaner.min.cleanable.ratio
log.cleaner.enable log.cleaner.delete.retention.ms log.cleaner.min.compaction.lag.ms
log.cleaner.max.compaction.lag.ms log.index.size.max.bytes log.index.interval.bytes
log.flush.interval.messages log.segment.delete.delay.ms log.flush.scheduler.interval.ms
log.flush.interval.ms log.flush.offset.checkpoint.interval.ms log.flush.start.offset.checkpoint.interval.ms
log.preallocate log.message.format.version log.message.timestamp.type
log.message.timestamp.difference.max.ms log.max.id.map.snapshots num.recovery.threads.per.data.dir
auto.create.topics.enable min.insync.replicas create.topic.policy.class.name
alter.config.policy.class.name log.message.downconversion.enable
controller.socket.timeout.ms default.replication.factor replica.lag.time.max.ms replica.socket.timeout.ms
replica.socket.receive.buffer.bytes replica.fetch.max.bytes replica.fetch.wait.max.ms
replica.fetch.min.bytes replica.fetch.response.max.bytes replica.fetch.backoff.ms num.replica.fetchers
replica.high.watermark.checkpoint.interval.ms fetch.purgatory.purge.interval.requests
producer.purgatory.purge.interval.requests delete.records.purgatory.purge.interval.requests
auto.leader.rebalance.enable leader.imbalance.per.broker.percentage leader.imbalance.check.interval.seconds
unclean.leader.election.enable security.inter.broker.protocol inter.broker.protocol.version
inter.broker.listener.name replica.selector.class
controlled.shutdown.max.retries controlled.shutdown.retry.backoff.ms controlled.shutdown.enable
group.min.session.timeout.ms group.max.session.timeout.ms group.initial.rebalance.delay.ms group.max.size
offset.metadata.max.bytes offsets.load.buffer.size offsets.topic.replication.factor
offsets.topic.num.partitions offsets.topic.segment.bytes offsets.topic.compression.codec
offsets.retention.minutes offsets.retention.check.interval.ms offsets.commit.timeout.ms
offsets.commit.required.acks
transactional.id.expiration.ms transaction.max.timeout.ms transaction.state.log.min.isr
transaction.state.log.load.buffer.size transaction.state.log.num.partitions
transaction.state.log.segment.bytes transaction.state.log.replication.factor
transaction.abort.timed.out.transaction.cleanup.interval.ms
transaction.remove.expired.transaction.cleanup.interval.ms producer.id.expiration.ms
producer.id.expiration.check.interval.ms
max.incremental.fetch.session.cache.slots fetch.max.bytes
quota.window.num replication.quota.window.num alter.log.dirs.replication.quota.window.num
controller.quota.window.num quota.window.size.seconds replication.quota.window.size.seconds
alter.log.dirs.replication.quota.window.size.seconds controller.quota.window.size.seconds
client.quota.callback.class delete.topic.enable compression.type
metrics.sample.window.ms metrics.num.samples metric.reporters metrics.recording.level
kafka.metrics.reporters kafka.metrics.polling.interval.secs
principal.builder.class connections.max.reauth.ms security.providers
ssl.protocol ssl.provider ssl.cipher.suites ssl.enabled.protocols ssl.keystore.type ssl.keystore.location
ssl.keystore.password ssl.key.password ssl.keystore.key ssl.keystore.certificate.chain ssl.truststore.type
ssl.truststore.location ssl.truststore.password ssl.truststore.certificates ssl.keymanager.algorithm
ssl.trustmanager.algorithm ssl.endpoint.identification.algorithm ssl.secure.random.implementation
ssl.client.auth ssl.principal.mapping.rules ssl.engine.factory.class
sasl.mechanism.inter.broker.protocol sasl.jaas.config sasl.enabled.mechanisms
sasl.server.callback.handler.class sasl.client.callback.handler.class sasl.login.class
sasl.login.callback.handler.class sasl.kerberos.service.name sasl.kerberos.kinit.cmd
sasl.kerberos.ticket.renew.window.factor sasl.kerberos.ticket.renew.jitter
sasl.kerberos.min.time.before.relogin sasl.kerberos.principal.to.local.rules
sasl.login.refresh.window.factor sasl.login.refresh.window.jitter sasl.login.refresh.min.period.seconds
sasl.login.refresh.buffer.seconds
delegation.token.master.key delegation.token.secret.key delegation.token.max.lifetime.ms
delegation.token.expiry.time.ms delegation.token.expiry.check.interval.ms
password.encoder.secret password.encoder.old.secret password.encoder.keyfactory.algorithm
password.encoder.cipher.algorithm password.encoder.key.length password.encoder.iterations
remote.log.storage.system.enable remote.log.manager.thread.pool.size
""".split())


# Kafka keys that must not be ignored: ignoring them would change where data
# goes; they are refused with the hint naming replikafka's key.
KAFKA_KEYS_NOT_IGNORED = frozenset({"log.dir"})


def split_kafka_keys(names, known) -> tuple[list[str], list[str]]:
    """``names`` not in ``known`` -> (Kafka's own keys, to ignore with a
    warning; keys that are nobody's, to refuse). Pure."""
    ignored, unknown = [], []
    for name in names:
        if name in known:
            continue
        (ignored if name in KAFKA_BROKER_KEYS and name not in KAFKA_KEYS_NOT_IGNORED else unknown).append(name)
    return sorted(ignored), unknown
