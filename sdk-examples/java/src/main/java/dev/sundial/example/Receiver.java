package dev.sundial.example;

import com.standardwebhooks.Webhook;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Takes Sundial's result webhooks (JDK com.sun.net.httpserver): verifies the Standard
 * Webhooks signature with com.standardwebhooks:standardwebhooks and the classic
 * X-Sundial-* one with javax.crypto.Mac and MessageDigest.isEqual, refuses stale
 * timestamps and replayed nonces, and stores each result once per webhook-id (a repeat
 * is answered 200, not stored again) in an append-only JSON-lines file, read back at
 * start. GET /results lists them.
 *
 * <pre>SUNDIAL_WEBHOOK_SECRET=whsec_... java -cp target/sundial-example.jar dev.sundial.example.Receiver --listen 127.0.0.1:8090 --store results.jsonl</pre>
 */
public final class Receiver {
  private static final long TOLERANCE_S = 300;

  private final List<String> secrets = new ArrayList<>();
  private final List<byte[]> keys = new ArrayList<>();
  private final Path store;
  /** webhook-id -> the stored line (JSON without "deliveries"). */
  private final Map<String, String> results = new LinkedHashMap<>();
  private final Map<String, Integer> deliveries = new HashMap<>();
  private final Map<String, Long> nonces = new HashMap<>();

  Receiver(String secretList, Path store) throws IOException {
    for (String s : secretList.split(",")) {
      s = s.strip();
      if (s.isEmpty()) {
        continue;
      }
      byte[] key = Base64.getDecoder().decode(s.replaceFirst("^whsec_", ""));
      secrets.add(s);
      keys.add(key);
    }
    if (keys.isEmpty()) {
      throw new IllegalArgumentException("SUNDIAL_WEBHOOK_SECRET is required (the server's --webhook-secret)");
    }
    this.store = store;
    if (Files.exists(store)) {
      for (String line : Files.readAllLines(store)) {
        String id = idOf(line);
        if (id != null) {
          results.put(id, line);
        }
      }
    }
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> flags = Main.flags(args);
    String[] listen = flags.getOrDefault("listen", "127.0.0.1:8090").split(":");
    Receiver r = new Receiver(System.getenv().getOrDefault("SUNDIAL_WEBHOOK_SECRET", ""),
        Path.of(flags.getOrDefault("store", "results.jsonl")));
    HttpServer server = HttpServer.create(new InetSocketAddress(listen[0], Integer.parseInt(listen[1])), 0);
    server.createContext("/webhook", r::webhook);
    server.createContext("/results", r::list);
    server.start();
    System.out.println("JAVA_RECEIVER_READY " + String.join(":", listen));
  }

  private void webhook(HttpExchange ex) throws IOException {
    try (ex) {
      if (!ex.getRequestMethod().equals("POST")) {
        answer(ex, 405, "POST only");
        return;
      }
      byte[] body = ex.getRequestBody().readNBytes(1 << 20);
      List<String> verified;
      try {
        verified = verify(ex, body);
      } catch (SecurityException e) {
        System.err.println("delivery refused: " + e.getMessage());
        answer(ex, 401, e.getMessage());
        return;
      }
      String id = ex.getRequestHeaders().getFirst("webhook-id");
      if (id == null || id.isEmpty()) {
        answer(ex, 400, "webhook-id: missing");
        return;
      }
      synchronized (this) {
        deliveries.merge(id, 1, Integer::sum);
        if (results.containsKey(id)) {
          answer(ex, 200, "already stored");
          return;
        }
        String line = "{\"webhook_id\":" + quote(id) + ",\"verified\":["
            + String.join(",", verified.stream().map(Receiver::quote).toList()) + "],\"received_at_ms\":"
            + System.currentTimeMillis() + ",\"body\":" + new String(body, StandardCharsets.UTF_8) + "}";
        Files.writeString(store, line + "\n", StandardOpenOption.CREATE, StandardOpenOption.APPEND,
            StandardOpenOption.SYNC);
        results.put(id, line);
      }
      System.err.println("stored " + id + " verified " + verified);
      answer(ex, 200, "stored");
    }
  }

  /** Checks every scheme present (at least one must be); returns those that verified. */
  private List<String> verify(HttpExchange ex, byte[] body) {
    var h = ex.getRequestHeaders();
    List<String> verified = new ArrayList<>();
    if (h.getFirst("webhook-signature") != null) {
      Map<String, List<String>> headers = new HashMap<>();
      for (String name : List.of("webhook-id", "webhook-timestamp", "webhook-signature")) {
        String v = h.getFirst(name);
        headers.put(name, v == null ? List.of() : List.of(v));
      }
      boolean ok = false;
      for (String s : secrets) {
        try {
          new Webhook(s).verify(new String(body, StandardCharsets.UTF_8), headers);
          ok = true;
          break;
        } catch (Exception e) {
          // try the next secret
        }
      }
      if (!ok) {
        throw new SecurityException("webhook-signature: no signature matches (or webhook-timestamp is stale)");
      }
      verified.add("standard");
    }
    if (h.getFirst("X-Sundial-Signature") != null) {
      verifyClassic(h.getFirst("X-Sundial-Timestamp"), h.getFirst("X-Sundial-Nonce"),
          h.getFirst("X-Sundial-Signature"), body);
      verified.add("classic");
    }
    if (verified.isEmpty()) {
      throw new SecurityException("no signature: neither webhook-signature nor X-Sundial-Signature");
    }
    return verified;
  }

  /** Lowercase hex HMAC-SHA256 of body || timestamp || nonce, one per active secret. */
  void verifyClassic(String ts, String nonce, String signatures, byte[] body) {
    long secs;
    try {
      secs = Long.parseLong(ts == null ? "" : ts);
    } catch (NumberFormatException e) {
      throw new SecurityException("X-Sundial-Timestamp: not unix seconds");
    }
    long now = System.currentTimeMillis() / 1000;
    if (Math.abs(now - secs) > TOLERANCE_S) {
      throw new SecurityException("X-Sundial-Timestamp: more than 5 minutes from this clock");
    }
    if (nonce == null || nonce.isEmpty() || nonce.length() > 128) {
      throw new SecurityException("X-Sundial-Nonce: missing or longer than 128 characters");
    }
    boolean match = false;
    for (byte[] key : keys) {
      byte[] want = HexFormat.of().formatHex(hmac(key, body, ts, nonce)).getBytes(StandardCharsets.US_ASCII);
      for (String got : signatures.split(",")) {
        if (MessageDigest.isEqual(got.strip().getBytes(StandardCharsets.US_ASCII), want)) {
          match = true;
        }
      }
    }
    if (!match) {
      throw new SecurityException("X-Sundial-Signature: no signature matches");
    }
    synchronized (this) {
      nonces.values().removeIf(until -> until < now);
      if (nonces.containsKey(nonce)) {
        throw new SecurityException("X-Sundial-Nonce: replayed");
      }
      nonces.put(nonce, now + 2 * TOLERANCE_S);
    }
  }

  static byte[] hmac(byte[] key, byte[] body, String ts, String nonce) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(key, "HmacSHA256"));
      mac.update(body);
      mac.update(ts.getBytes(StandardCharsets.US_ASCII));
      mac.update(nonce.getBytes(StandardCharsets.US_ASCII));
      return mac.doFinal();
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }

  private void list(HttpExchange ex) throws IOException {
    try (ex) {
      List<String> entries = new ArrayList<>();
      synchronized (this) {
        results.forEach((id, line) -> entries.add(
            line.substring(0, line.length() - 1) + ",\"deliveries\":" + deliveries.getOrDefault(id, 0) + "}"));
      }
      ex.getResponseHeaders().set("content-type", "application/json");
      byte[] json = ("[" + String.join(",", entries) + "]").getBytes(StandardCharsets.UTF_8);
      ex.sendResponseHeaders(200, json.length);
      try (OutputStream os = ex.getResponseBody()) {
        os.write(json);
      }
    }
  }

  private static void answer(HttpExchange ex, int status, String text) throws IOException {
    byte[] b = (text + "\n").getBytes(StandardCharsets.UTF_8);
    ex.sendResponseHeaders(status, b.length);
    try (OutputStream os = ex.getResponseBody()) {
      os.write(b);
    }
  }

  /** The webhook_id of a stored line (it is the line's first field). */
  private static String idOf(String line) {
    String prefix = "{\"webhook_id\":\"";
    if (!line.startsWith(prefix)) {
      return null;
    }
    int end = line.indexOf('"', prefix.length());
    return end < 0 ? null : line.substring(prefix.length(), end);
  }

  static String quote(String s) {
    StringBuilder b = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') {
        b.append('\\').append(c);
      } else if (c < 0x20) {
        b.append(String.format("\\u%04x", (int) c));
      } else {
        b.append(c);
      }
    }
    return b.append('"').toString();
  }
}
