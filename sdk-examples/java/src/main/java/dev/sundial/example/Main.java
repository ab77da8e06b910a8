package dev.sundial.example;

import dev.sundial.executor.Failure;
import dev.sundial.executor.SundialExecutor;
import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * A Sundial executor in Java: the protocol lives in dev.sundial.executor, this class
 * only registers handlers. Handlers: echo (the payload back as output), sleep (payload
 * = milliseconds; stops when the run is cancelled) and fail (fails with error code
 * "java_fail"). SIGTERM or SIGINT: no new work, running handlers get 10 s to finish
 * (a shutdown hook), then the process exits.
 *
 * <pre>java -cp target/sundial-example.jar dev.sundial.example.Main --endpoints localhost:50051 --group demo</pre>
 */
public final class Main {
  public static void main(String[] args) throws Exception {
    Map<String, String> flags = flags(args);
    String nodeId = flags.getOrDefault("node-id", defaultNodeId());
    SundialExecutor ex = new SundialExecutor(
        Arrays.asList(flags.getOrDefault("endpoints", "localhost:50051").split(",")),
        flags.getOrDefault("group", "demo"),
        nodeId,
        System.getenv().getOrDefault("SUNDIAL_EXECUTOR_TOKEN", ""),
        Integer.parseInt(flags.getOrDefault("max-concurrency", "0")));
    ex.handle("echo", run -> run.payload());
    ex.handle("sleep", run -> {
      long ms = Long.parseLong(new String(run.payload(), StandardCharsets.UTF_8).trim());
      System.err.println("sleep started " + run.scheduleId() + " attempt " + run.attempt() + " ms " + ms);
      try {
        Thread.sleep(ms);
      } catch (InterruptedException e) {
        System.err.println("sleep cancelled " + run.scheduleId() + " attempt " + run.attempt());
        throw e;
      }
      return ("slept " + ms + " ms").getBytes(StandardCharsets.UTF_8);
    });
    ex.handle("fail", run -> {
      throw new Failure("java_fail", "fail always fails");
    });
    ex.onWelcome(() -> System.out.println("JAVA_EXECUTOR_READY " + nodeId));
    // The JVM exits 143 after SIGTERM; a drain that finished is a clean exit, so the
    // hook ends the process with 0 itself.
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      ex.shutdown(Duration.ofSeconds(10));
      Runtime.getRuntime().halt(0);
    }));
    ex.start();
    Thread.currentThread().join(); // until a signal runs the shutdown hook
  }

  static Map<String, String> flags(String[] args) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --flag value, got " + args[i]);
      }
      out.put(args[i].substring(2), args[i + 1]);
    }
    return out;
  }

  private static String defaultNodeId() throws Exception {
    String pid = ManagementFactory.getRuntimeMXBean().getName().split("@")[0];
    return (InetAddress.getLocalHost().getHostName() + "-" + pid).replaceAll("[^A-Za-z0-9._-]", "-");
  }
}
