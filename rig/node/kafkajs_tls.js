// A kafkajs producer and consumer over real TLS (Node's own OpenSSL), each logging its TLS
// secrets from the socket's 'keylog' event (what Node offers instead of SSLKEYLOGFILE), and
// printing what it produced (offsets from the ProduceResponse kafkajs returns) and consumed,
// one JSON object per line on stdout. The rig (rig/tls_scenarios.py) turns those lines into
// the manifest's truths.
//
// Usage: node kafkajs_tls.js SPEC.json, where SPEC holds brokers, topic, items (key/value as
// base64, partition, timestamp), group, the two key-log paths and each client's cipher suites.
'use strict'
const fs = require('fs')
const net = require('net')
const tls = require('tls')
const { Kafka, logLevel } = require('kafkajs')

const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
const say = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')

// kafkajs's default socket factory, plus the 'keylog' listener: every secret line of every
// connection this client opens is appended to its key log, in NSS key log format.
function keyloggingSocketFactory (keylogPath, ciphers) {
  return ({ host, port, ssl, onConnect }) => {
    const options = Object.assign({ host, port }, net.isIP(host) ? {} : { servername: host }, ssl,
      ciphers ? { ciphers } : {})
    const socket = tls.connect(options, onConnect)
    socket.on('keylog', (line) => fs.appendFileSync(keylogPath, line))
    socket.setKeepAlive(true, 60000)
    return socket
  }
}

function client (clientId, keylogPath, ciphers) {
  return new Kafka({
    clientId,
    brokers: spec.brokers,
    ssl: { rejectUnauthorized: false }, // the proxy's certificate is a throw-away self-signed one
    socketFactory: keyloggingSocketFactory(keylogPath, ciphers),
    logLevel: logLevel.ERROR,
    retry: { retries: 5 }
  })
}

const b64 = (s) => (s === null || s === undefined ? null : Buffer.from(s, 'base64'))
const out64 = (b) => (b === null || b === undefined ? null : Buffer.from(b).toString('base64'))

async function produce () {
  const producer = client(spec.producer.client_id, spec.producer.keylog, spec.producer.ciphers)
    .producer({ allowAutoTopicCreation: false, idempotent: false })
  await producer.connect()
  // One record per send: the ProduceResponse's base offset is then that record's offset.
  for (const it of spec.items) {
    const headers = {}
    for (const h of it.headers || []) headers[h.key] = b64(h.value)
    const [meta] = await producer.send({
      topic: spec.topic,
      acks: -1,
      messages: [{ key: b64(it.key), value: b64(it.value), headers, partition: it.partition,
        timestamp: String(it.timestamp_ms) }]
    })
    say({ role: 'produced', topic: meta.topicName, partition: meta.partition,
      offset: Number(meta.baseOffset), error_code: meta.errorCode, item: it })
  }
  await producer.disconnect()
}

async function consume () {
  const consumer = client(spec.consumer.client_id, spec.consumer.keylog, spec.consumer.ciphers)
    .consumer({ groupId: spec.group, heartbeatInterval: 500, sessionTimeout: 10000,
      maxWaitTimeInMs: 200 })
  await consumer.connect()
  await consumer.subscribe({ topic: spec.topic, fromBeginning: true })
  let seen = 0
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`consumed ${seen} of ${spec.items.length}`)),
      spec.timeout_ms || 30000)
    consumer.run({
      autoCommit: false,
      eachMessage: async ({ topic, partition, message }) => {
        const headers = Object.entries(message.headers || {}).map(([key, value]) =>
          ({ key, value: out64(value) }))
        say({ role: 'consumed', topic, partition, offset: Number(message.offset),
          key: out64(message.key), value: out64(message.value), headers,
          timestamp_ms: Number(message.timestamp) })
        seen += 1
        if (seen >= spec.items.length) {
          clearTimeout(timer)
          resolve()
        }
      }
    }).catch(reject)
  })
  // Commit what was read, as a consumer that processed it would.
  await consumer.commitOffsets([{ topic: spec.topic, partition: 0, offset: String(seen) }])
  await consumer.disconnect()
}

produce().then(consume).then(() => process.exit(0), (err) => {
  process.stderr.write(`kafkajs_tls: ${err.stack || err}\n`)
  process.exit(1)
})
