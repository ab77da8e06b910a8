package dev.sundial.executor;

/** Fails a run with a machine-readable code and a message for people. */
public class Failure extends Exception {
  private final String code;

  public Failure(String code, String message) {
    super(message);
    this.code = code;
  }

  public String code() {
    return code;
  }
}
