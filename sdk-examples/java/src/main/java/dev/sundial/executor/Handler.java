package dev.sundial.executor;

/**
 * One handler: runs a dispatch and returns its output (given to GetRun and the
 * webhook). Throw {@link Failure} to fail with an error code, {@link Cancelled} to end
 * the run CANCELLED, anything else to fail with code "error". When the run is
 * cancelled, its lease is lost or the executor stops, the handler's thread is
 * interrupted and {@link Run#cancelled()} turns true: return promptly then.
 */
@FunctionalInterface
public interface Handler {
  byte[] handle(Run run) throws Exception;
}
