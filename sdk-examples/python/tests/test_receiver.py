"""The receiver's checks: the README's worked example for both schemes, stale
timestamps, replayed nonces, and storing once per webhook-id."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from receiver import Refused, Store, classic_signature

SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
BODY = b'{"schedule_id":"hello@1764680400000","status":"SUCCEEDED"}'
KEY = base64.b64decode(SECRET.removeprefix("whsec_"))


def test_the_readmes_worked_example() -> None:
    assert (classic_signature(KEY, BODY, "1764680401", "0193a5f0c2d47c3e9b1f2a6d8e4c5b7a")
            == "0995e3a800721e0d2373d4cf4f3f07dbfbf2c7076997a339d56a6fa214960918")
    signed = Webhook(SECRET).sign("hello@1764680400000", datetime.fromtimestamp(1764680401, tz=UTC),
                                  BODY.decode())
    assert signed == "v1,dBeCNEsmEaMuiiC5+x3dXT/OeA7k3Y37nx+SNmZUiik="


def signed_headers(ts: int, nonce: str) -> dict[str, str]:
    standard = Webhook(SECRET).sign("w1", datetime.fromtimestamp(ts, tz=UTC), BODY.decode())
    return {"webhook-id": "w1", "webhook-timestamp": str(ts), "webhook-signature": standard,
            "x-sundial-timestamp": str(ts), "x-sundial-nonce": nonce,
            "x-sundial-signature": classic_signature(KEY, BODY, str(ts), nonce)}


def test_both_schemes_stale_and_replayed(tmp_path: Path) -> None:
    store = Store([SECRET], str(tmp_path / "r.db"))
    now = int(time.time())
    assert store.verify(signed_headers(now, "n1"), BODY, now) == ["standard", "classic"]
    with pytest.raises(Refused, match="replayed"):
        store.verify(signed_headers(now, "n1"), BODY, now)
    with pytest.raises(Refused, match="stale|5 minutes"):
        store.verify(signed_headers(now - 600, "n2"), BODY, now)
    tampered = signed_headers(now, "n3")
    with pytest.raises(Refused, match="webhook-signature"):
        store.verify(tampered, BODY + b" ", now)
    with pytest.raises(Refused, match="no signature"):
        store.verify({}, BODY, now)


def test_stored_once_per_webhook_id(tmp_path: Path) -> None:
    store = Store([SECRET], str(tmp_path / "r.db"))
    assert store.keep("w1", ["standard", "classic"], BODY)
    assert not store.keep("w1", ["standard", "classic"], BODY)
    assert store.keep("w2", ["classic"], BODY)
    results = store.results()
    assert [(r["webhook_id"], r["deliveries"]) for r in results] == [("w1", 2), ("w2", 1)]
    # A restart keeps the promise: the same file still knows w1.
    again = Store([SECRET], str(tmp_path / "r.db"))
    assert not again.keep("w1", ["classic"], BODY)
