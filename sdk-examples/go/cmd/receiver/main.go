// Command receiver takes Sundial's result webhooks: it verifies both signature schemes
// the server sends (Standard Webhooks with the standard-webhooks Go library, the
// classic X-Sundial-* one with crypto/hmac), refuses stale timestamps and replayed
// nonces, and stores each result once per webhook-id (a repeat is answered 200 and
// not stored again). Results go to an append-only JSON-lines file, read back at start
// so a restart keeps the once-only promise, and are listed by GET /results.
//
//	SUNDIAL_WEBHOOK_SECRET=whsec_... go run ./cmd/receiver --listen 127.0.0.1:8090 --store results.jsonl
//
// The secret is the server's --webhook-secret; during a rotation give both,
// comma-separated.
package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// tolerance is how far a delivery's timestamp may be from this clock, either way.
const tolerance = 5 * time.Minute

// Stored is one result as kept: the delivery's body and which signatures verified.
type Stored struct {
	WebhookID  string          `json:"webhook_id"`
	Verified   []string        `json:"verified"`
	ReceivedAt int64           `json:"received_at_ms"`
	Body       json.RawMessage `json:"body"`
}

type receiver struct {
	secrets []string
	keys    [][]byte
	file    *os.File
	log     *slog.Logger

	mu         sync.Mutex
	results    map[string]Stored
	order      []string
	deliveries map[string]int       // webhook-id -> deliveries verified (repeats included)
	nonces     map[string]time.Time // classic nonces seen -> when they may be forgotten
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to listen on")
	store := flag.String("store", "results.jsonl", "append-only file of stored results")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	r, err := newReceiver(os.Getenv("SUNDIAL_WEBHOOK_SECRET"), *store, log)
	if err != nil {
		log.Error("receiver", "err", err)
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook", r.webhook)
	mux.HandleFunc("GET /results", r.list)
	log.Info("receiver listening", "addr", *listen)
	fmt.Printf("GO_RECEIVER_READY %s\n", *listen)
	if err := http.ListenAndServe(*listen, mux); err != nil {
		log.Error("receiver", "err", err)
		os.Exit(1)
	}
}

func newReceiver(secretList, path string, log *slog.Logger) (*receiver, error) {
	r := &receiver{log: log, results: map[string]Stored{}, deliveries: map[string]int{}, nonces: map[string]time.Time{}}
	for _, s := range strings.Split(secretList, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil || len(key) == 0 {
			return nil, fmt.Errorf("SUNDIAL_WEBHOOK_SECRET: %q is not whsec_<base64>", s[:min(len(s), 12)]+"…")
		}
		r.secrets, r.keys = append(r.secrets, s), append(r.keys, key)
	}
	if len(r.keys) == 0 {
		return nil, errors.New("SUNDIAL_WEBHOOK_SECRET is required (the server's --webhook-secret)")
	}
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 4<<20)
		for sc.Scan() {
			var s Stored
			if json.Unmarshal(sc.Bytes(), &s) == nil && s.WebhookID != "" {
				r.results[s.WebhookID] = s
				r.order = append(r.order, s.WebhookID)
			}
		}
		f.Close()
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	r.file = f
	return r, nil
}

func (r *receiver) webhook(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 1<<20))
	if err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	verified, err := r.verify(req.Header, body, time.Now())
	if err != nil {
		r.log.Warn("delivery refused", "err", err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	id := req.Header.Get("webhook-id")
	if id == "" {
		http.Error(w, "webhook-id: missing", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deliveries[id]++
	if _, seen := r.results[id]; seen {
		w.WriteHeader(http.StatusOK) // a repeat: answered, not stored again
		fmt.Fprintln(w, "already stored")
		return
	}
	s := Stored{WebhookID: id, Verified: verified, ReceivedAt: time.Now().UnixMilli(), Body: json.RawMessage(body)}
	line, err := json.Marshal(s)
	if err == nil {
		_, err = r.file.Write(append(line, '\n'))
	}
	if err == nil {
		err = r.file.Sync()
	}
	if err != nil { // not stored: a 500 makes the server retry
		http.Error(w, "store: "+err.Error(), http.StatusInternalServerError)
		return
	}
	r.results[id] = s
	r.order = append(r.order, id)
	r.log.Info("stored", "webhook_id", id, "verified", verified)
	fmt.Fprintln(w, "stored")
}

// verify checks every scheme present (at least one must be): Standard Webhooks and
// the classic X-Sundial-* signature. It returns the schemes that verified.
func (r *receiver) verify(h http.Header, body []byte, now time.Time) ([]string, error) {
	var verified []string
	if h.Get("webhook-signature") != "" {
		ok := false
		for _, s := range r.secrets {
			wh, err := standardwebhooks.NewWebhook(s)
			if err == nil && wh.Verify(body, h) == nil {
				ok = true
				break
			}
		}
		if !ok {
			return nil, errors.New("webhook-signature: no signature matches (or webhook-timestamp is stale)")
		}
		verified = append(verified, "standard")
	}
	if h.Get("X-Sundial-Signature") != "" {
		if err := r.verifyClassic(h, body, now); err != nil {
			return nil, err
		}
		verified = append(verified, "classic")
	}
	if len(verified) == 0 {
		return nil, errors.New("no signature: neither webhook-signature nor X-Sundial-Signature")
	}
	return verified, nil
}

// verifyClassic: lowercase hex HMAC-SHA256 of body || timestamp || nonce, one per
// active secret, comma-separated; the timestamp within tolerance, the nonce unseen.
func (r *receiver) verifyClassic(h http.Header, body []byte, now time.Time) error {
	ts, nonce := h.Get("X-Sundial-Timestamp"), h.Get("X-Sundial-Nonce")
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("X-Sundial-Timestamp: not unix seconds: %q", ts[:min(len(ts), 20)])
	}
	if d := now.Sub(time.Unix(secs, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("X-Sundial-Timestamp: %s from this clock, more than %s", d.Round(time.Second), tolerance)
	}
	if nonce == "" || len(nonce) > 128 {
		return errors.New("X-Sundial-Nonce: missing or longer than 128 characters")
	}
	match := false
	for _, key := range r.keys {
		mac := hmac.New(sha256.New, key)
		mac.Write(body)
		mac.Write([]byte(ts))
		mac.Write([]byte(nonce))
		want := []byte(hex.EncodeToString(mac.Sum(nil)))
		for _, got := range strings.Split(h.Get("X-Sundial-Signature"), ",") {
			if hmac.Equal([]byte(strings.TrimSpace(got)), want) {
				match = true
			}
		}
	}
	if !match {
		return errors.New("X-Sundial-Signature: no signature matches")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for n, until := range r.nonces {
		if now.After(until) {
			delete(r.nonces, n)
		}
	}
	if _, seen := r.nonces[nonce]; seen {
		return errors.New("X-Sundial-Nonce: replayed")
	}
	r.nonces[nonce] = now.Add(2 * tolerance)
	return nil
}

// list answers every stored result, oldest first, with how many verified deliveries
// each got (repeats included).
func (r *receiver) list(w http.ResponseWriter, _ *http.Request) {
	type entry struct {
		Stored
		Deliveries int `json:"deliveries"`
	}
	r.mu.Lock()
	out := make([]entry, 0, len(r.order))
	for _, id := range r.order {
		out = append(out, entry{r.results[id], r.deliveries[id]})
	}
	r.mu.Unlock()
	w.Header().Set("content-type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
