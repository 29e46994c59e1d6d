package dev.ksched.worker;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.fasterxml.jackson.databind.node.TextNode;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * ksched's schemas, read from {@code schemas/}: one {@code io.ksched.<Name>.avsc} per named
 * type, referencing others by name. Each top-level record is made self-contained the way
 * docs/schema-evolution.md says (every referenced type defined at its first use), so its
 * fingerprint is the one ksched writes. Older versions of Dispatch and CancelDispatch from
 * {@code schemas/history/} are known too, so dispatches from an older scheduler still decode.
 */
final class Schemas {
    private static final String NS = "io.ksched";
    private static final List<String> TOP_LEVEL = List.of(
        "Dispatch", "CancelDispatch", "Heartbeat", "JobStarted", "JobProgress", "JobResult");
    private static final List<String> READ = List.of("Dispatch", "CancelDispatch");

    private final Map<String, Schema> current = new HashMap<>();
    private final Map<Long, BinaryMessageDecoder<GenericRecord>> decoders = new HashMap<>();
    private final Map<String, BinaryMessageEncoder<GenericRecord>> encoders = new HashMap<>();

    Schemas(Path dir) throws IOException {
        ObjectMapper json = new ObjectMapper();
        Map<String, JsonNode> defs = new HashMap<>();
        try (Stream<Path> files = Files.list(dir)) {
            for (Path f : (Iterable<Path>) files::iterator) {
                String file = f.getFileName().toString();
                if (file.startsWith(NS + ".") && file.endsWith(".avsc")) {
                    defs.put(file.substring(0, file.length() - ".avsc".length()), json.readTree(f.toFile()));
                }
            }
        }
        for (String name : TOP_LEVEL) {
            JsonNode def = defs.get(NS + "." + name);
            if (def == null) {
                throw new IOException("no " + NS + "." + name + ".avsc in " + dir);
            }
            Schema s = new Schema.Parser().parse(inline(def, defs, new HashSet<>()).toString());
            current.put(name, s);
            encoders.put(name, new BinaryMessageEncoder<>(GenericData.get(), s));
        }
        for (String name : READ) {
            Schema reader = current.get(name);
            BinaryMessageDecoder<GenericRecord> decoder = new BinaryMessageDecoder<>(GenericData.get(), reader);
            decoders.put(Worker.fingerprint(reader), decoder);
            Path history = dir.resolve("history");
            if (Files.isDirectory(history)) {
                try (Stream<Path> files = Files.list(history)) {
                    for (Path f : (Iterable<Path>) files::iterator) {
                        if (f.getFileName().toString().startsWith(name + ".")) {
                            Schema older = new Schema.Parser().parse(f.toFile());
                            decoder.addSchema(older);
                            decoders.put(Worker.fingerprint(older), decoder);
                        }
                    }
                }
            }
        }
    }

    /** A record of a top-level type, decoded by the fingerprint in its header. */
    GenericRecord decode(byte[] bytes) {
        BinaryMessageDecoder<GenericRecord> d = decoders.get(Worker.headerFingerprint(bytes));
        if (d == null) {
            throw new IllegalArgumentException(String.format(
                "unknown writer schema fingerprint %016x (not a Dispatch or CancelDispatch this worker knows)",
                Long.reverseBytes(Worker.headerFingerprint(bytes))));
        }
        try {
            return d.decode(bytes);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    byte[] encode(GenericRecord r) {
        try {
            ByteBuffer b = encoders.get(r.getSchema().getName()).encode(r);
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** A builder for a record of a top-level type, with every default filled in. */
    GenericRecordBuilder record(String name) {
        return new GenericRecordBuilder(current.get(name));
    }

    /** The schema of a field of a top-level record. */
    Schema field(String record, String field) {
        return current.get(record).getField(field).schema();
    }

    GenericData.EnumSymbol symbol(String record, String field, String symbol) {
        return new GenericData.EnumSymbol(field(record, field), symbol);
    }

    private static String fullName(JsonNode node) {
        String name = node.path("name").asText();
        if (name.contains(".")) {
            return name;
        }
        String ns = node.path("namespace").asText(NS);
        return ns.isEmpty() ? name : ns + "." + name;
    }

    /** The self-contained form of {@code node}: each named type of {@code defs} defined at its first use. */
    private static JsonNode inline(JsonNode node, Map<String, JsonNode> defs, Set<String> seen) {
        if (node.isTextual()) {
            String s = node.asText();
            String full = s.contains(".") || !defs.containsKey(NS + "." + s) ? s : NS + "." + s;
            JsonNode def = defs.get(full);
            if (def != null && !seen.contains(full)) {
                return inline(def, defs, seen);
            }
            return TextNode.valueOf(def != null ? full : s);
        }
        if (node.isArray()) {
            ArrayNode out = ((ArrayNode) node).arrayNode();
            node.forEach(b -> out.add(inline(b, defs, seen)));
            return out;
        }
        if (!node.isObject()) {
            return node;
        }
        ObjectNode out = ((ObjectNode) node).deepCopy();
        String type = node.path("type").isTextual() ? node.path("type").asText() : "";
        switch (type) {
            case "record", "error", "enum", "fixed" -> {
                String full = fullName(node);
                seen.add(full);
                out.put("name", full);
                out.remove("namespace");
                if (type.equals("record") || type.equals("error")) {
                    ArrayNode fields = out.putArray("fields");
                    for (Iterator<JsonNode> it = node.path("fields").elements(); it.hasNext(); ) {
                        ObjectNode f = ((ObjectNode) it.next()).deepCopy();
                        f.set("type", inline(f.path("type"), defs, seen));
                        fields.add(f);
                    }
                }
            }
            case "array" -> out.set("items", inline(node.path("items"), defs, seen));
            case "map" -> out.set("values", inline(node.path("values"), defs, seen));
            default -> { }
        }
        return out;
    }
}
