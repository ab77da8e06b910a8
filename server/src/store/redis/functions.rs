//! The Lua library every Redis decision runs in: the scripts of `lua/` registered once as
//! Redis functions (`FUNCTION LOAD`, Redis 7) and called with `FCALL`.
//!
//! A script sent by `EVALSHA` runs its whole text at every call: the shared helpers
//! (`common.lua`, `runlib.lua`, `beginlib.lua`, some thirty closures and two tables)
//! were created again before each decision, about 3.7 µs of Redis's CPU per call
//! (measured with `redis-benchmark`: 4.95 µs for an `EVALSHA` of the helpers and
//! `return 1`, 1.28 µs for `return 1` alone). In a library they are created once, when
//! it is loaded, and each function's body runs with them as upvalues.
//!
//! The library's name carries a hash of its text (`sundial_<16 hex>`), and so does each
//! function's, so instances of different builds sharing one Redis each call their own
//! code. A Redis that lost its functions (restarted without persistence, `FUNCTION
//! FLUSH`) answers "Function not found": the call loads the library again and is sent
//! once more, as `EVALSHA` is after `NOSCRIPT`.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ToRedisArgs, Value};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The counter a function bumps after each call (`StoreMeta::activity`).
pub(super) type Activity = Arc<watch::Sender<u64>>;

/// The library's text and name.
pub(super) struct Library {
    name: String,
    source: String,
    /// Calls answered with keys to declare (`Call::invoke_declaring`), each one more
    /// round trip.
    asked: std::sync::atomic::AtomicU64,
    /// The functions whose scripts read their `KEYS` (the others build every key name
    /// from their arguments, and declare keys only for Redis Cluster).
    reads_keys: std::collections::HashSet<String>,
}

impl Library {
    /// The library of `functions` (name, body), each body a script of `lua/` run with
    /// `KEYS` and `ARGV` as its parameters, after `prelude` (the helpers, defined once).
    pub(super) fn build(prelude: &[&str], functions: &[(&str, &str)]) -> Arc<Self> {
        let mut hash = Sha256::new();
        for part in prelude {
            hash.update(part.as_bytes());
        }
        for (name, body) in functions {
            hash.update(name.as_bytes());
            hash.update(body.as_bytes());
        }
        #[cfg(test)]
        hash.update(KEY_CHECK.as_bytes());
        let name = format!("sundial_{}", &hex::encode(hash.finalize())[..16]);
        let mut source = format!("#!lua name={name}\n");
        #[cfg(test)]
        source.push_str(KEY_CHECK);
        for part in prelude {
            source.push_str(&checked(part));
            source.push('\n');
        }
        // Each function's body is a function of `BODIES`, called by the function Redis
        // registers: it resets what the prelude keeps for one call (`store_time_reply`,
        // common.lua, caches the store's clock for one call, `busy_counts` the lease
        // counts it read), runs the body, then writes
        // the partition's fencing counter if the call made a token (`save_tokens`,
        // runlib.lua).
        source.push_str("local BODIES = {}\n");
        for (function, body) in functions {
            source.push_str(&format!(
                "BODIES['{function}'] = function(KEYS, ARGV)\n{check}{body}\nend\n\
                 redis.register_function('{name}_{function}', function(KEYS, ARGV)\n\
                 store_time_reply, claim_ms, claimed, run_info = nil, nil, nil, {{}}\n\
                 call_keys, declared_set, empty_queues, asked = KEYS, nil, nil, nil\n\
                 token_key, token_last, busy_counts = nil, nil, nil\n\
                 prefix_only = #KEYS == 1 and KEYS[1] == ARGV[1]\n\
                 local out = BODIES['{function}'](KEYS, ARGV)\n\
                 if token_last then save_tokens() end\n\
                 return out\nend)\n",
                check = key_check(function),
                body = checked(body),
            ));
        }
        let reads_keys = functions
            .iter()
            .filter(|(_, body)| body.contains("KEYS["))
            .map(|(function, _)| (*function).to_owned())
            .collect();
        Arc::new(Self {
            name,
            source,
            asked: Default::default(),
            reads_keys,
        })
    }

    /// How many calls were answered with keys to declare, and called again.
    pub(super) fn asked(&self) -> u64 {
        self.asked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Loads (or replaces) the library; a Redis older than 7 refuses `FUNCTION`.
    pub(super) async fn load(&self, c: &mut impl ConnectionLike) -> RedisResult<()> {
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.source)
            .query_async(c)
            .await?;
        Ok(())
    }

    /// One function of the library; one given `activity` bumps it after each call.
    /// With `declare` (Redis Cluster, and every test build), its calls declare the
    /// keys they name; without, only a function whose script reads its `KEYS` does,
    /// the others name their slot by their first argument alone (on one Redis no slot
    /// moves: declaring ten keys a call cost Redis ~10 % more per run, `steps`).
    pub(super) fn function(
        self: &Arc<Self>,
        name: &str,
        activity: Option<Activity>,
        declare: bool,
    ) -> Function {
        Function {
            name: format!("{}_{name}", self.name),
            library: self.clone(),
            activity,
            declares: declare || self.reads_keys.contains(name),
        }
    }
}

/// A function of the library, called like redis-rs's `Script`: `.arg(…)…invoke_async`.
pub(super) struct Function {
    name: String,
    library: Arc<Library>,
    activity: Option<Activity>,
    /// Whether its calls send the keys they declare (`Library::function`).
    declares: bool,
}

impl Function {
    /// Its name in Redis (the library's, then the script's).
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn prepare_invoke(&self) -> Call<'_> {
        Call {
            function: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub(super) fn arg<T: ToRedisArgs>(&self, arg: T) -> Call<'_> {
        let mut call = self.prepare_invoke();
        call.arg(arg);
        call
    }

    pub(super) fn key<T: ToRedisArgs>(&self, key: T) -> Call<'_> {
        let mut call = self.prepare_invoke();
        call.key(key);
        call
    }
}

/// One call of a function, its keys and arguments gathered.
pub(super) struct Call<'a> {
    function: &'a Function,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Each of `keys` (none: nothing).
    pub(super) fn keys<T: ToRedisArgs>(
        &mut self,
        keys: Option<impl IntoIterator<Item = T>>,
    ) -> &mut Self {
        for key in keys.into_iter().flatten() {
            self.key(key);
        }
        self
    }

    /// `FCALL`s a function that may answer `{'need', key...}` instead (`want` in
    /// common.lua: keys of its slot it found in its records and this call did not
    /// declare; it answers so before it writes anything): calls again declaring those
    /// too, at most `NEED_ROUNDS` times in all.
    pub(super) async fn invoke_declaring<T: FromRedisValue>(
        &mut self,
        c: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        for _ in 0..NEED_ROUNDS {
            let reply: Value = self.invoke_async(c).await?;
            match needed_keys(reply) {
                Ok(keys) => {
                    self.function
                        .library
                        .asked
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.keys.extend(keys);
                }
                Err(reply) => return Ok(redis::from_redis_value(reply)?),
            }
        }
        Err(RedisError::from((
            ErrorKind::Client,
            "a function kept asking for keys to declare",
            self.function.name.clone(),
        )))
    }

    /// `FCALL`s the function; loads the library and calls again when Redis has lost it.
    pub(super) async fn invoke_async<T: FromRedisValue>(
        &self,
        c: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        // A call that declares no keys (or, on one Redis, need not: see
        // `Library::function`) names its slot by its first argument (its partition's
        // prefix, `<prefix>:{p}:`, or a key of its slot): that is declared as its one
        // key, so a cluster client sends the call to the node that serves the slot.
        let keys: &[Vec<u8>] = if self.keys.is_empty() || !self.function.declares {
            &self.args[..self.args.len().min(1)]
        } else {
            &self.keys
        };
        #[cfg(test)]
        assert_one_slot(&self.function.name, keys);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.function.name).arg(keys.len());
        for k in keys {
            cmd.arg(k.as_slice());
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        let r = match cmd.query_async(c).await {
            Err(e) if e.to_string().contains("Function not found") => {
                self.function.library.load(c).await?;
                cmd.query_async(c).await
            }
            r => r,
        };
        // Loud even where the caller would only log a failed call.
        #[cfg(test)]
        if let Err(e) = &r {
            assert!(
                !e.to_string().contains("undeclared key"),
                "{}: {e}",
                self.function.name
            );
        }
        if let Some(activity) = &self.function.activity {
            activity.send_modify(|n| *n = n.wrapping_add(1));
        }
        r
    }
}

/// How many times `Call::invoke_declaring` calls a function: the keys a script asks
/// for can name records that name more (a run's shards), one level a round.
const NEED_ROUNDS: usize = 4;

/// The keys a `{'need', key...}` reply asks for, or the reply when it is another.
fn needed_keys(reply: Value) -> std::result::Result<Vec<Vec<u8>>, Value> {
    match reply {
        Value::Array(items) if matches!(items.first(), Some(Value::BulkString(b)) if b.as_slice() == b"need") => {
            Ok(items
                .into_iter()
                .skip(1)
                .filter_map(|k| match k {
                    Value::BulkString(k) => Some(k),
                    _ => None,
                })
                .collect())
        }
        other => Err(other),
    }
}

/// Tests only: the check that a function touches no key of its slot it did not declare
/// (`lua/keycheck.lua`), put first in the library, with every `redis.call` of the
/// scripts going through it.
#[cfg(test)]
const KEY_CHECK: &str = include_str!("lua/keycheck.lua");

/// A script's text as the library runs it: in the tests, its Redis commands go through
/// the key check.
#[cfg(test)]
fn checked(lua: &str) -> std::borrow::Cow<'_, str> {
    lua.replace("redis.call(", "checked_call(").into()
}

#[cfg(not(test))]
fn checked(lua: &str) -> std::borrow::Cow<'_, str> {
    lua.into()
}

/// What a function does first about the key check: in the tests, every function but
/// those of `DERIVES_KEYS` has its calls checked against its declared keys, unless the
/// call declared only its prefix (a store the tests open `as_one_redis`).
#[cfg(test)]
fn key_check(function: &str) -> &'static str {
    if super::DERIVES_KEYS.contains(&function) {
        "checked_keys = nil\n"
    } else {
        "checked_keys = (not prefix_only) and KEYS or nil\n"
    }
}

#[cfg(not(test))]
fn key_check(_function: &str) -> &'static str {
    ""
}

/// Every key a call declares hashes to one slot, as Redis Cluster requires of a
/// script (checked on every call the tests make).
#[cfg(test)]
fn assert_one_slot(function: &str, keys: &[Vec<u8>]) {
    let tagged = |k: &[u8]| {
        k.iter()
            .position(|&b| b == b'{')
            .is_some_and(|open| k[open + 1..].iter().skip(1).any(|&b| b == b'}'))
    };
    assert!(
        keys.first().is_some_and(|k| tagged(k)),
        "{function}: a call names its slot by a hash-tagged first key (or first argument)"
    );
    if let Some((first, rest)) = keys.split_first() {
        let slot = crate::testing::key_slot(first);
        for key in rest {
            assert_eq!(
                crate::testing::key_slot(key),
                slot,
                "{function}: key {:?} is not in the slot of {:?}",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(first)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::key_slot;

    #[test]
    fn key_slots_are_redis_clusters() {
        // Redis's own examples (CLUSTER KEYSLOT).
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(
            key_slot(b"foo{}{bar}"),
            key_slot(b"bar"),
            "an empty tag hashes the whole key"
        );
        assert_eq!(
            key_slot(b"sundial:{7}:run:x"),
            key_slot(b"sundial:{7}:outbox_due")
        );
    }
}
