package dev.ksched.worker;

import java.io.IOException;
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A ksched worker in Java, written from docs/workers.md and schemas/ alone.
 *
 * <p>It joins its pool's consumer group on {@code <prefix>dispatch.<pool>}, heartbeats its owned
 * partitions, commits each dispatch's offset before the job starts, runs jobs one at a time
 * (the "work" upper-cases the payload), reports JobStarted and JobResult with the dispatch's
 * attempt number to its reply partition, skips attempts cancelled before they started, and
 * drains on SIGTERM. Records are Avro single-object encoded generic records.
 *
 * <p>Job labels steer the outcome, for tests: {@code fail_attempts=N} fails attempts 1..N
 * FAILED_RETRYABLE; {@code fatal=true} fails FAILED_FATAL.
 */
public final class Worker {
    private final Args args;
    private final Schemas schemas;
    private final KafkaProducer<byte[], byte[]> producer;
    private final KafkaConsumer<byte[], byte[]> consumer;
    private final String dispatchTopic;
    /** Looked up once: a slow resolver must not hold up every heartbeat. */
    private final String host;
    private final Set<Integer> owned = ConcurrentHashMap.newKeySet();
    private final Set<String> active = ConcurrentHashMap.newKeySet();
    private final Set<String> cancelled = new HashSet<>();
    private final AtomicBoolean running = new AtomicBoolean(true);
    private int done;

    Worker(Args args) throws IOException {
        this.args = args;
        this.schemas = new Schemas(args.schemas);
        this.dispatchTopic = args.prefix + "dispatch." + args.pool;
        this.host = InetAddress.getLocalHost().getHostName();
        Properties p = new Properties();
        p.put("bootstrap.servers", args.bootstrap);
        p.put("client.id", "ksched-java-" + args.workerId);
        p.put("enable.idempotence", "true");
        p.put("linger.ms", "1");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.putAll(args.properties);
        this.producer = new KafkaProducer<>(p);
        Properties c = new Properties();
        c.put("bootstrap.servers", args.bootstrap);
        c.put("client.id", "ksched-java-" + args.workerId);
        c.put("group.id", args.prefix + "workers." + args.pool);
        // Dispatches are written in transactions: an aborted one must never run.
        c.put("isolation.level", "read_committed");
        c.put("auto.offset.reset", "earliest");
        c.put("enable.auto.commit", "false");
        c.put("key.deserializer", ByteArrayDeserializer.class.getName());
        c.put("value.deserializer", ByteArrayDeserializer.class.getName());
        c.putAll(args.properties);
        this.consumer = new KafkaConsumer<>(c);
    }

    void run() throws InterruptedException {
        ScheduledExecutorService beats = Executors.newSingleThreadScheduledExecutor();
        beats.scheduleAtFixedRate(() -> heartbeat(false), 0, args.heartbeatMs, TimeUnit.MILLISECONDS);
        consumer.subscribe(List.of(dispatchTopic), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                partitions.forEach(tp -> owned.add(tp.partition()));
                heartbeat(false);
            }

            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                partitions.forEach(tp -> owned.remove(tp.partition()));
            }
        });
        System.out.println(args.workerId + ": consuming " + dispatchTopic);
        try {
            while (running.get()) {
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(200))) {
                    handle(rec);
                    if (args.maxJobs > 0 && done >= args.maxJobs) {
                        running.set(false);
                        break;
                    }
                }
            }
        } catch (WakeupException e) {
            // SIGTERM: drain below.
        }
        // Draining: nothing new. The periodic beat stops first and is waited for: a beat
        // still being built would otherwise land after the draining one and undo it.
        beats.shutdown();
        if (!beats.awaitTermination(5, TimeUnit.SECONDS)) {
            beats.shutdownNow();
        }
        // Say so, leave the group (partitions go to the others), say so again.
        drainingHeartbeat();
        consumer.close();
        drainingHeartbeat();
        producer.close();
        System.out.println(args.workerId + ": stopped after " + done + " jobs");
    }

    private void handle(ConsumerRecord<byte[], byte[]> rec) {
        // Commit past the dispatch before the job starts: a crash mid-job must not run it
        // again here; the scheduler retries it as a new attempt (docs/workers.md).
        consumer.commitSync(Map.of(new TopicPartition(rec.topic(), rec.partition()),
            new OffsetAndMetadata(rec.offset() + 1)));
        GenericRecord r;
        try {
            r = schemas.decode(rec.value());
        } catch (RuntimeException e) {
            System.err.println(args.workerId + ": skipping an undecodable record at offset "
                + rec.offset() + ": " + e);
            return;
        }
        String name = r.getSchema().getName();
        if (name.equals("CancelDispatch")) {
            cancelled.add(r.get("job_id") + "#" + r.get("attempt"));
        } else if (name.equals("Dispatch")) {
            runJob(r);
        }
    }

    private void runJob(GenericRecord dispatch) {
        GenericRecord job = (GenericRecord) dispatch.get("job");
        String jobId = job.get("job_id").toString();
        int attempt = (Integer) dispatch.get("attempt");
        Integer reply = (Integer) dispatch.get("reply_partition");
        if (cancelled.remove(jobId + "#" + attempt)) {
            System.out.println(args.workerId + ": " + jobId + " attempt " + attempt + " cancelled before it started");
            return;
        }
        active.add(jobId);
        long started = System.nanoTime();
        send(args.prefix + "results", reply, jobId, schemas.record("JobStarted")
            .set("job_id", jobId)
            .set("attempt", attempt)
            .set("worker_id", args.workerId)
            .set("started_at", System.currentTimeMillis())
            .build());
        Map<String, String> labels = strings(job.get("labels"));
        GenericRecordBuilder result = schemas.record("JobResult")
            .set("job_id", jobId)
            .set("attempt", attempt)
            .set("worker_id", args.workerId);
        int failAttempts = Integer.parseInt(labels.getOrDefault("fail_attempts", "0"));
        ByteBuffer payload = (ByteBuffer) job.get("payload");
        byte[] bytes = new byte[payload.remaining()];
        payload.duplicate().get(bytes);
        String sealed = sealedValue(strings(job.get("env")), bytes);
        if (sealed != null) {
            // This worker has no keyring: a job with sealed values fails without running
            // (docs/workers.md, "Secrets and sealed payloads").
            result.set("status", schemas.symbol("JobResult", "status", "FAILED_FATAL"))
                .set("error_code", "secret_unavailable")
                .set("error_message", sealed + " is sealed and this worker has no keyring");
        } else if ("true".equals(labels.get("fatal"))) {
            result.set("status", schemas.symbol("JobResult", "status", "FAILED_FATAL"))
                .set("error_code", "asked_to_fail_fatal")
                .set("error_message", "the job's labels asked for a fatal failure");
        } else if (attempt <= failAttempts) {
            result.set("status", schemas.symbol("JobResult", "status", "FAILED_RETRYABLE"))
                .set("error_code", "asked_to_fail")
                .set("error_message", "attempt " + attempt + " of " + failAttempts + " asked to fail");
        } else {
            String output = new String(bytes, StandardCharsets.UTF_8).toUpperCase();
            Schema metaSchema = schemas.field("JobResult", "result_meta");
            GenericRecord meta = new GenericRecordBuilder(metaSchema)
                .set("size_bytes", (long) output.getBytes(StandardCharsets.UTF_8).length)
                .set("content_type", "text/plain")
                .set("labels", Map.of("worker_lang", "java"))
                .build();
            result.set("status", schemas.symbol("JobResult", "status", "SUCCEEDED"))
                .set("result_ptr", "inline:" + output)
                .set("result_meta", meta);
        }
        result.set("execution_ms", (System.nanoTime() - started) / 1_000_000)
            .set("finished_at", System.currentTimeMillis());
        send(args.prefix + "results", reply, jobId, result.build());
        active.remove(jobId);
        done++;
        System.out.println(args.workerId + ": " + jobId + " attempt " + attempt + " done");
    }

    /** A draining heartbeat, waited for: a lost one would leave the scheduler placing here. */
    private void drainingHeartbeat() {
        try {
            heartbeat(true).get(10, TimeUnit.SECONDS);
        } catch (ExecutionException | TimeoutException e) {
            System.err.println(args.workerId + ": the draining heartbeat was not acknowledged: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private Future<RecordMetadata> heartbeat(boolean draining) {
        GenericRecord hb = schemas.record("Heartbeat")
            .set("worker_id", args.workerId)
            .set("pool", args.pool)
            .set("active_jobs", active.size())
            .set("max_parallel_jobs", 1)
            .set("capabilities", List.of("java"))
            .set("labels", Map.of("lang", "java", "host", host))
            .set("owned_partitions", new ArrayList<>(new TreeSet<>(owned)))
            .set("active_job_ids", new ArrayList<>(new TreeSet<>(active)))
            .set("draining", draining)
            .set("sent_at", System.currentTimeMillis())
            .build();
        return send(args.prefix + "heartbeats", null, args.workerId, hb);
    }

    private Future<RecordMetadata> send(String topic, Integer partition, String key, GenericRecord record) {
        return producer.send(new ProducerRecord<>(topic, partition, key.getBytes(StandardCharsets.UTF_8),
            schemas.encode(record)));
    }

    /** What of the job is sealed for its tenant (`kse1.` values), or null. Never logs a value. */
    static String sealedValue(Map<String, String> env, byte[] payload) {
        for (Map.Entry<String, String> e : env.entrySet()) {
            if (e.getKey().startsWith("$") && e.getValue().startsWith(SEALED)) {
                return "env " + e.getKey();
            }
        }
        String p = new String(payload, 0, Math.min(payload.length, SEALED.length()), StandardCharsets.UTF_8);
        return p.equals(SEALED) ? "the payload" : null;
    }

    /** The prefix of a value ksched-secrets sealed (docs/security.md#secrets). */
    private static final String SEALED = "kse1.";

    private static Map<String, String> strings(Object avroMap) {
        Map<String, String> out = new HashMap<>();
        if (avroMap instanceof Map<?, ?> m) {
            m.forEach((k, v) -> out.put(k.toString(), v.toString()));
        }
        return out;
    }

    public static void main(String[] argv) throws Exception {
        Args args = Args.parse(argv);
        Worker w = new Worker(args);
        CountDownLatch stopped = new CountDownLatch(1);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            w.running.set(false);
            w.consumer.wakeup();
            try {
                stopped.await(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                main.interrupt();
            }
        }));
        try {
            w.run();
        } finally {
            stopped.countDown();
        }
    }

    /** Command-line arguments. */
    static final class Args {
        String bootstrap = "127.0.0.1:9092";
        String prefix = "ksched.";
        String pool = "default";
        String workerId = "java-1";
        Path schemas = Path.of("schemas");
        long heartbeatMs = 1000;
        int maxJobs = 0;
        Properties properties = new Properties();

        static Args parse(String[] argv) {
            Args a = new Args();
            for (int i = 0; i < argv.length; i++) {
                String flag = argv[i];
                if (flag.equals("--help") || flag.equals("-h")) {
                    System.out.println("usage: Worker [--bootstrap HOST:PORT] [--prefix ksched.] [--pool default]"
                        + " [--worker-id ID] [--schemas DIR] [--heartbeat-ms 1000] [--max-jobs N] [-X key=value]...");
                    System.exit(0);
                }
                if (i + 1 >= argv.length) {
                    throw new IllegalArgumentException(flag + " needs a value");
                }
                String v = argv[++i];
                switch (flag) {
                    case "--bootstrap" -> a.bootstrap = v;
                    case "--prefix" -> a.prefix = v;
                    case "--pool" -> a.pool = v;
                    case "--worker-id" -> a.workerId = v;
                    case "--schemas" -> a.schemas = Path.of(v);
                    case "--heartbeat-ms" -> a.heartbeatMs = Long.parseLong(v);
                    case "--max-jobs" -> a.maxJobs = Integer.parseInt(v);
                    case "-X" -> {
                        int eq = v.indexOf('=');
                        if (eq < 1) {
                            throw new IllegalArgumentException("-X " + v + ": key=value");
                        }
                        a.properties.put(v.substring(0, eq), v.substring(eq + 1));
                    }
                    default -> throw new IllegalArgumentException("unknown flag " + flag);
                }
            }
            return a;
        }
    }

    /** Fingerprint of a schema as single-object encoding writes it (CRC-64-AVRO, little-endian). */
    static long fingerprint(Schema s) {
        return SchemaNormalization.parsingFingerprint64(s);
    }

    /** Reads the 8-byte fingerprint of a single-object header. */
    static long headerFingerprint(byte[] bytes) {
        if (bytes == null || bytes.length < 10 || (bytes[0] & 0xFF) != 0xC3 || bytes[1] != 0x01) {
            throw new IllegalArgumentException("not Avro single-object encoding (C3 01 + fingerprint)");
        }
        return ByteBuffer.wrap(bytes, 2, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
    }
}
