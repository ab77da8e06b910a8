"""Takes Sundial's result webhooks (standard library http.server): verifies the
Standard Webhooks signature with the `standardwebhooks` package and the classic
X-Sundial-* one with hmac.compare_digest, refuses stale timestamps and replayed nonces,
and stores each result once per webhook-id in sqlite (a repeat is answered 200 and not
stored again). GET /results lists them.

    SUNDIAL_WEBHOOK_SECRET=whsec_... python receiver.py --listen 127.0.0.1:8090 --store results.db

The secret is the server's --webhook-secret; during a rotation give both,
comma-separated.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

TOLERANCE_S = 300


class Refused(Exception):
    """A delivery that does not verify; the message names the header and the reason."""


class Store:
    """Verified results, once per webhook-id, and the classic nonces seen."""

    def __init__(self, secrets: list[str], path: str) -> None:
        if not secrets:
            raise ValueError("SUNDIAL_WEBHOOK_SECRET is required (the server's --webhook-secret)")
        self.secrets = secrets
        self.keys = [base64.b64decode(s.removeprefix("whsec_")) for s in secrets]
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS results (webhook_id TEXT PRIMARY KEY,"
                        " verified TEXT NOT NULL, received_at_ms INTEGER NOT NULL, body TEXT NOT NULL,"
                        " deliveries INTEGER NOT NULL)")
        self.db.commit()
        self.nonces: dict[str, float] = {}

    def verify(self, headers: Mapping[str, str], body: bytes, now: float) -> list[str]:
        """Checks every scheme present (at least one must be); returns those verified.
        Header names are lowercase."""
        verified = []
        if headers.get("webhook-signature"):
            wanted = {k: headers.get(k, "") for k in ("webhook-id", "webhook-timestamp", "webhook-signature")}
            if not any(self._standard(s, body, wanted) for s in self.secrets):
                raise Refused("webhook-signature: no signature matches (or webhook-timestamp is stale)")
            verified.append("standard")
        if headers.get("x-sundial-signature"):
            self.verify_classic(headers.get("x-sundial-timestamp", ""), headers.get("x-sundial-nonce", ""),
                                headers.get("x-sundial-signature", ""), body, now)
            verified.append("classic")
        if not verified:
            raise Refused("no signature: neither webhook-signature nor X-Sundial-Signature")
        return verified

    @staticmethod
    def _standard(secret: str, body: bytes, headers: dict[str, str]) -> bool:
        try:
            Webhook(secret).verify(body, headers)
            return True
        except Exception:
            return False

    def verify_classic(self, ts: str, nonce: str, signatures: str, body: bytes, now: float) -> None:
        """Lowercase hex HMAC-SHA256 of body || timestamp || nonce, one per active secret."""
        try:
            secs = int(ts)
        except ValueError:
            raise Refused("X-Sundial-Timestamp: not unix seconds") from None
        if abs(now - secs) > TOLERANCE_S:
            raise Refused("X-Sundial-Timestamp: more than 5 minutes from this clock")
        if not nonce or len(nonce) > 128:
            raise Refused("X-Sundial-Nonce: missing or longer than 128 characters")
        given = [s.strip() for s in signatures.split(",")]
        if not any(hmac.compare_digest(g, classic_signature(k, body, ts, nonce)) for k in self.keys for g in given):
            raise Refused("X-Sundial-Signature: no signature matches")
        with self.lock:
            self.nonces = {n: until for n, until in self.nonces.items() if until > now}
            if nonce in self.nonces:
                raise Refused("X-Sundial-Nonce: replayed")
            self.nonces[nonce] = now + 2 * TOLERANCE_S

    def keep(self, webhook_id: str, verified: list[str], body: bytes) -> bool:
        """Stores the result unless one with this webhook-id is stored; True if stored."""
        with self.lock:
            cur = self.db.execute(
                "INSERT INTO results VALUES (?, ?, ?, ?, 1) ON CONFLICT (webhook_id)"
                " DO UPDATE SET deliveries = deliveries + 1",
                (webhook_id, json.dumps(verified), int(time.time() * 1000), body.decode()))
            self.db.commit()
            row = self.db.execute("SELECT deliveries FROM results WHERE webhook_id = ?", (webhook_id,)).fetchone()
            return cur.rowcount == 1 and row is not None and row[0] == 1

    def results(self) -> list[dict[str, object]]:
        with self.lock:
            rows = self.db.execute(
                "SELECT webhook_id, verified, received_at_ms, body, deliveries FROM results ORDER BY rowid").fetchall()
        return [{"webhook_id": r[0], "verified": json.loads(r[1]), "received_at_ms": r[2],
                 "body": json.loads(r[3]), "deliveries": r[4]} for r in rows]


def classic_signature(key: bytes, body: bytes, ts: str, nonce: str) -> str:
    return hmac.new(key, body + ts.encode() + nonce.encode(), hashlib.sha256).hexdigest()


def make_handler(store: Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 (the http.server name)
            if self.path != "/webhook":
                self._answer(404, b"not found\n")
                return
            length = int(self.headers.get("content-length", "0"))
            if length > 1 << 20:
                self._answer(413, b"body: more than 1 MiB\n")
                return
            body = self.rfile.read(length)
            lowered = {k.lower(): v for k, v in self.headers.items()}
            try:
                verified = store.verify(lowered, body, time.time())
            except Refused as e:
                print(f"delivery refused: {e}", file=sys.stderr, flush=True)
                self._answer(401, f"{e}\n".encode())
                return
            webhook_id = lowered.get("webhook-id", "")
            if not webhook_id:
                self._answer(400, b"webhook-id: missing\n")
                return
            stored = store.keep(webhook_id, verified, body)
            self._answer(200, b"stored\n" if stored else b"already stored\n")

        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/results":
                self._answer(404, b"not found\n")
                return
            self._answer(200, json.dumps(store.results()).encode(), "application/json")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:8090")
    p.add_argument("--store", default="results.db", help="sqlite file of stored results")
    args = p.parse_args()
    secrets = [s.strip() for s in os.environ.get("SUNDIAL_WEBHOOK_SECRET", "").split(",") if s.strip()]
    store = Store(secrets, args.store)
    host, port = args.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), make_handler(store))
    print(f"PY_RECEIVER_READY {args.listen}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
