package dev.sundial.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.standardwebhooks.Webhook;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The README's worked example ("Verifying a delivery, in any language") in Java. */
class ReceiverTest {
  static final String SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
  static final String BODY = "{\"schedule_id\":\"hello@1764680400000\",\"status\":\"SUCCEEDED\"}";

  @Test
  void classicSignatureIsTheReadmes() {
    byte[] key = java.util.Base64.getDecoder().decode(SECRET.substring("whsec_".length()));
    byte[] mac = Receiver.hmac(key, BODY.getBytes(StandardCharsets.UTF_8), "1764680401",
        "0193a5f0c2d47c3e9b1f2a6d8e4c5b7a");
    assertEquals("0995e3a800721e0d2373d4cf4f3f07dbfbf2c7076997a339d56a6fa214960918", HexFormat.of().formatHex(mac));
  }

  @Test
  void standardSignatureIsTheReadmes() throws Exception {
    assertEquals("v1,dBeCNEsmEaMuiiC5+x3dXT/OeA7k3Y37nx+SNmZUiik=",
        new Webhook(SECRET).sign("hello@1764680400000", 1764680401L, BODY));
  }

  @Test
  void staleTimestampsAndReplayedNoncesAreRefused(@TempDir Path dir) throws Exception {
    Receiver r = new Receiver(SECRET, dir.resolve("results.jsonl"));
    byte[] key = java.util.Base64.getDecoder().decode(SECRET.substring("whsec_".length()));
    byte[] body = BODY.getBytes(StandardCharsets.UTF_8);
    String now = Long.toString(System.currentTimeMillis() / 1000);
    String sig = HexFormat.of().formatHex(Receiver.hmac(key, body, now, "n1"));
    r.verifyClassic(now, "n1", sig, body);
    SecurityException replay = assertThrows(SecurityException.class, () -> r.verifyClassic(now, "n1", sig, body));
    assertEquals("X-Sundial-Nonce: replayed", replay.getMessage());
    String old = Long.toString(System.currentTimeMillis() / 1000 - 600);
    String oldSig = HexFormat.of().formatHex(Receiver.hmac(key, body, old, "n2"));
    assertThrows(SecurityException.class, () -> r.verifyClassic(old, "n2", oldSig, body));
    assertThrows(SecurityException.class, () -> r.verifyClassic(now, "n3", sig, body), "signed with another nonce");
    assertEquals(false, Files.exists(dir.resolve("results.jsonl")) && Files.size(dir.resolve("results.jsonl")) > 0);
  }
}
