package dev.sundial.executor;

/** Thrown by a handler to end its run CANCELLED (final, not retried). */
public class Cancelled extends Exception {
  public Cancelled(String message) {
    super(message);
  }
}
