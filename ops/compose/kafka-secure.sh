#!/bin/sh
# The Kafka broker of docker-compose.secure.yml: SASL/SCRAM and ACLs, the same
# settings as `triage kafka up --secure` (triage/kafka/secure.py), with passwords
# read from Docker secrets instead of being written into any file of the repo.
#
#   sh kafka-secure.sh          format storage once (admin as a SCRAM user), start
#   sh kafka-secure.sh health   exit 0 when the broker answers an authenticated call
#
# tests/unit/test_compose.py checks that every security property of the local
# secured broker is set here too.
set -eu

secret() { tr -d '\r\n' < "/run/secrets/$1"; }
admin_pw=$(secret admin)
umask 077  # the files below hold passwords

if [ "${1:-}" = health ]; then
  cat > /tmp/health.properties <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
PROPS
  exec /opt/kafka/bin/kafka-broker-api-versions.sh --bootstrap-server localhost:19092 \
    --command-config /tmp/health.properties >/dev/null 2>&1
fi

controller_pw=$(secret controller)
props=/tmp/server.properties
cat > "$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@kafka:9093
controller.listener.names=CONTROLLER
listeners=INTERNAL://0.0.0.0:19092,EXTERNAL://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093
advertised.listeners=INTERNAL://kafka:19092,EXTERNAL://127.0.0.1:9092
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=INTERNAL:SASL_PLAINTEXT,EXTERNAL:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.internal.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="controller" password="$controller_pw" user_controller="$controller_pw";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:controller
allow.everyone.if.no.acl.found=false
log.dirs=/var/lib/kafka/data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
PROPS

/opt/kafka/bin/kafka-storage.sh format --ignore-formatted -t "$CLUSTER_ID" -c "$props" \
  --add-scram "SCRAM-SHA-512=[name=admin,password=$admin_pw]"
exec /opt/kafka/bin/kafka-server-start.sh "$props"
