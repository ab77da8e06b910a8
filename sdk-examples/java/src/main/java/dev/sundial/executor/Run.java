package dev.sundial.executor;

import java.time.Instant;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;

/** One dispatch as a handler sees it. */
public final class Run {
  private final String scheduleId;
  private final String jobId;
  private final int attempt;
  private final int shardIndex;
  private final int shardTotal;
  private final byte[] payload;
  private final Map<String, String> labels;
  private final Instant scheduledAt;
  private final AtomicBoolean cancelled;

  Run(dev.sundial.v1.Dispatch d, AtomicBoolean cancelled) {
    this.scheduleId = d.getRun().getScheduleId();
    this.jobId = d.getJobId();
    this.attempt = d.getRun().getAttempt();
    this.shardIndex = d.getRun().getShardIndex();
    this.shardTotal = d.getShardTotal();
    this.payload = d.getPayload().toByteArray();
    this.labels = Map.copyOf(d.getLabelsMap());
    this.scheduledAt = Instant.ofEpochMilli(d.getScheduledAtMs());
    this.cancelled = cancelled;
  }

  public String scheduleId() { return scheduleId; }
  public String jobId() { return jobId; }
  public int attempt() { return attempt; }
  public int shardIndex() { return shardIndex; }
  public int shardTotal() { return shardTotal; }
  public byte[] payload() { return payload.clone(); }
  public Map<String, String> labels() { return labels; }
  public Instant scheduledAt() { return scheduledAt; }
  /** True once the run was cancelled, its lease lost or the executor is stopping. */
  public boolean cancelled() { return cancelled.get(); }
}
