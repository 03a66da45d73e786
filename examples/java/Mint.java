// Gets COUNT Snowflake IDs from a snowlease sidecar in mint mode and prints them.
//
// GET /next?count=N (N at most 4096 per request) over the unix socket the sidecar
// serves with --mint-socket (SNOWLEASE_MINT_SOCKET, default
// /var/run/snowlease/mint.sock), Accept: text/plain (one decimal ID a line).
// java.net.http has no unix sockets, so this writes one HTTP/1.1 request with
// Connection: close on a SocketChannel and reads the answer to its end (the
// sidecar sends Content-Length, never chunks, for these answers). While the
// sidecar answers 503 (no valid lease yet: claiming, guard_closed,
// clock_behind, ...) or its socket is not there yet, it retries after the
// Retry-After seconds (1 s without an answer), for at most --wait seconds
// (default 30) in all: the last try comes at the end of --wait.
//
// Prints COUNT IDs, one a line, increasing, and exits 0. When none come within
// --wait: a message on stderr (the last answer), exit 3, nothing on stdout.
// Any other answer (e.g. 400): exit 1. Bad arguments: exit 2.
//
// JDK 16+ (UnixDomainSocketAddress), nothing else. Run: java Mint.java [--wait SECONDS] COUNT

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

public final class Mint {
    /** Most IDs one request may ask for. */
    static final int MAX_BATCH = 4096;

    /** An HTTP answer: its status, Retry-After header (or null) and body. */
    record Reply(int status, String retryAfter, String body) {}

    /** No IDs: the exit code (3: none within --wait, 1: another answer) and why. */
    static final class NoIds extends Exception {
        final int code;

        NoIds(int code, String message) {
            super(message);
            this.code = code;
        }
    }

    /** One GET over the unix socket at {@code path}; closed after 5 s without an answer. */
    static Reply get(String path, String target) throws IOException {
        try (SocketChannel channel = SocketChannel.open(UnixDomainSocketAddress.of(path))) {
            CompletableFuture<Void> timeout = CompletableFuture.runAsync(() -> {
                try {
                    channel.close(); // ends a blocked read with AsynchronousCloseException
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            }, CompletableFuture.delayedExecutor(5, TimeUnit.SECONDS));
            try {
                String request = "GET " + target + " HTTP/1.1\r\nHost: snowlease\r\n"
                        + "Accept: text/plain\r\nConnection: close\r\n\r\n";
                channel.write(ByteBuffer.wrap(request.getBytes(StandardCharsets.US_ASCII)));
                byte[] raw = Channels.newInputStream(channel).readAllBytes();
                return parse(new String(raw, StandardCharsets.UTF_8));
            } finally {
                timeout.cancel(false);
            }
        }
    }

    /** Status line, headers and body of an HTTP/1.1 answer read to its end. */
    static Reply parse(String answer) throws IOException {
        int end = answer.indexOf("\r\n\r\n");
        String[] head = answer.substring(0, Math.max(end, 0)).split("\r\n");
        String[] statusLine = head[0].split(" ");
        if (end < 0 || statusLine.length < 2 || !statusLine[0].startsWith("HTTP/1.")) {
            throw new IOException("not an HTTP answer: " + answer);
        }
        String retryAfter = null;
        for (String line : head) {
            if (line.regionMatches(true, 0, "Retry-After:", 0, 12)) {
                retryAfter = line.substring(12).trim();
            }
        }
        return new Reply(Integer.parseInt(statusLine[1]), retryAfter, answer.substring(end + 4));
    }

    /** COUNT IDs as decimal strings; NoIds once --wait is spent or on another answer. */
    static List<String> mint(String path, int count, double waitS)
            throws NoIds, InterruptedException {
        long deadline = System.nanoTime() + (long) (waitS * 1e9);
        List<String> ids = new ArrayList<>(count);
        while (ids.size() < count) {
            Reply reply;
            try {
                reply = get(path, "/next?count=" + Math.min(count - ids.size(), MAX_BATCH));
            } catch (IOException e) { // no socket yet, refused, timeout
                reply = new Reply(0, null, e.toString());
            }
            if (reply.status() == 200) {
                reply.body().lines().filter(l -> !l.isEmpty()).forEach(ids::add);
                continue;
            }
            if (reply.status() != 0 && reply.status() != 503) {
                throw new NoIds(1, "GET /next answered " + reply.status() + ": "
                        + reply.body().strip());
            }
            long leftMs = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (leftMs <= 0) {
                String last = reply.status() == 0 ? reply.body()
                        : reply.status() + " " + reply.body().strip();
                throw new NoIds(3, "no IDs from " + path + " within " + waitS
                        + " s (last answer: " + last + ")");
            }
            String retry = reply.retryAfter();
            long delayMs = retry != null && retry.matches("[0-9]+")
                    ? Long.parseLong(retry) * 1000 : 1000;
            Thread.sleep(Math.min(delayMs, leftMs));
        }
        return ids;
    }

    public static void main(String[] args) throws InterruptedException {
        double waitS = 30;
        int count = 0;
        try {
            for (int i = 0; i < args.length; i++) {
                if (args[i].equals("--wait")) {
                    waitS = Double.parseDouble(args[++i]);
                } else if (args[i].startsWith("--wait=")) {
                    waitS = Double.parseDouble(args[i].substring(7));
                } else if (count == 0) {
                    count = Integer.parseInt(args[i]);
                } else {
                    count = -1;
                }
            }
        } catch (NumberFormatException | ArrayIndexOutOfBoundsException e) {
            count = -1;
        }
        if (count < 1 || !(waitS >= 0)) {
            System.err.println("usage: java Mint.java [--wait SECONDS] COUNT   (COUNT at least 1)");
            System.exit(2);
        }
        String path = System.getenv().getOrDefault(
                "SNOWLEASE_MINT_SOCKET", "/var/run/snowlease/mint.sock");
        try {
            List<String> ids = mint(path, count, waitS);
            System.out.print(String.join("\n", ids) + "\n");
        } catch (NoIds e) {
            System.err.println(e.getMessage());
            System.exit(e.code);
        }
    }
}
