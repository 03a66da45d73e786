// Reads the worker ID snowlease publishes and mints one Snowflake ID with it.
//
// The ID file (WORKER_ID_FILE, default /var/run/snowlease/worker-id) first: a
// decimal ID and a newline; if the state file beside it (<file>.state.json)
// exists, it must name the same ID, this boot's boot_id, and valid_until_boot_ms
// (ms on CLOCK_BOOTTIME, which no wall-clock step moves) in the future. Else
// GET <WORKER_ID_URL>/id (default http://127.0.0.1:7391). With neither, it
// refuses to mint: message on stderr, exit 3, nothing on stdout.
//
// Prints: worker_id=<n> source=<file|http> snowflake=<id>
// JDK 17, no dependencies (the JSON fields are read with a pattern; use
// your JSON library in an app). Run: java WorkerId.java
//
// An app that keeps running must stop minting as soon as the ID is gone, and
// before valid_until_boot_ms / lease_expires_in_ms passes (docs/app.md, "How the app
// reads the ID"); `snowlease exec` does that for you.

import java.io.IOException;
import java.math.BigDecimal;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.OptionalLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class WorkerId {
    /** 2020-01-01T00:00:00Z, the Snowflake epoch of this example. */
    private static final long EPOCH_MS = 1577836800000L;

    /** A non-negative integer field of a flat JSON object. */
    private static OptionalLong field(String json, String name) {
        Matcher m = Pattern.compile("\"" + name + "\"\\s*:\\s*([0-9]+)").matcher(json);
        return m.find() ? OptionalLong.of(Long.parseLong(m.group(1))) : OptionalLong.empty();
    }

    /** A string field of a flat JSON object. */
    private static Optional<String> text(String json, String name) {
        Matcher m = Pattern.compile("\"" + name + "\"\\s*:\\s*\"([^\"]*)\"").matcher(json);
        return m.find() ? Optional.of(m.group(1)) : Optional.empty();
    }

    /** True while the state file's deadline on the boot clock is ahead (same boot only). */
    static boolean bootDeadlineAhead(String state) {
        String bootId;
        long nowMs;
        try {
            bootId = Files.readString(Path.of("/proc/sys/kernel/random/boot_id")).strip();
            String uptime = Files.readString(Path.of("/proc/uptime")).split(" ")[0];
            // /proc/uptime is CLOCK_BOOTTIME in 10 ms steps: round up, so the deadline errs early.
            nowMs = new BigDecimal(uptime).movePointRight(3).longValue() + 10;
        } catch (IOException | RuntimeException e) {
            return false;
        }
        return text(state, "boot_id").equals(Optional.of(bootId))
                && field(state, "valid_until_boot_ms").orElse(0) > nowMs;
    }

    /** The worker ID from the ID file, or empty when missing, malformed or stale. */
    static OptionalInt fromFile(Path path) {
        String text;
        try {
            text = Files.readString(path);
        } catch (IOException e) {
            return OptionalInt.empty();
        }
        if (!text.matches("[0-9]+\n")) {
            return OptionalInt.empty();
        }
        int workerId = Integer.parseInt(text.strip());
        String state;
        try {
            state = Files.readString(Path.of(path + ".state.json"));
        } catch (NoSuchFileException e) {
            return OptionalInt.of(workerId);
        } catch (IOException e) {
            return OptionalInt.empty();
        }
        boolean same = field(state, "worker_id").orElse(-1) == workerId;
        boolean valid = bootDeadlineAhead(state);
        return same && valid ? OptionalInt.of(workerId) : OptionalInt.empty();
    }

    /** The worker ID from GET baseUrl/id, or empty when the sidecar has none or is down. */
    static OptionalInt fromHttp(String baseUrl) {
        HttpRequest request = HttpRequest.newBuilder(URI.create(baseUrl.replaceAll("/+$", "") + "/id"))
                .header("Accept", "application/json")
                .timeout(Duration.ofSeconds(2))
                .build();
        try {
            HttpResponse<String> reply = HttpClient.newBuilder()
                    .connectTimeout(Duration.ofSeconds(2))
                    .build()
                    .send(request, HttpResponse.BodyHandlers.ofString());
            OptionalLong id = field(reply.body(), "worker_id");
            boolean ok = reply.statusCode() == 200 && id.isPresent()
                    && field(reply.body(), "lease_expires_in_ms").orElse(0) > 0;
            return ok ? OptionalInt.of((int) id.getAsLong()) : OptionalInt.empty();
        } catch (IOException | IllegalArgumentException e) {
            return OptionalInt.empty();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return OptionalInt.empty();
        }
    }

    /** 41 bits of ms since EPOCH_MS, 10 bits worker ID, 12 bits sequence. */
    static long snowflake(int workerId, int sequence) {
        return ((System.currentTimeMillis() - EPOCH_MS) << 22) | ((long) workerId << 12) | sequence;
    }

    public static void main(String[] args) {
        String path = System.getenv().getOrDefault("WORKER_ID_FILE", "/var/run/snowlease/worker-id");
        String url = System.getenv().getOrDefault("WORKER_ID_URL", "http://127.0.0.1:7391");
        OptionalInt workerId = fromFile(Path.of(path));
        String source = "file";
        if (workerId.isEmpty()) {
            workerId = fromHttp(url);
            source = "http";
        }
        if (workerId.isEmpty()) {
            System.err.println("no worker ID published (" + path + ", " + url + "/id): refusing to mint");
            System.exit(3);
        }
        int id = workerId.getAsInt();
        System.out.println("worker_id=" + id + " source=" + source + " snowflake=" + snowflake(id, 0));
    }
}
