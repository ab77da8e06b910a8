//! The redo record of a write transaction: every change its steps make to a table,
//! written down as they make it, so that the same changes can be applied again to the
//! state they were made against (the journal replays them after a crash).
//!
//! Steps never touch a redb table for writing directly: they open tables through a
//! [`Tx`] and get a [`Logged`] table, which reads like the table (it derefs to it) but
//! whose `insert` and `remove` also append the change to the transaction's [`Redo`].
//! A `Logged` table has no mutable deref, so a write that bypasses the record does not
//! compile. [`replay`] applies a record to a transaction, table by table, in order.
//!
//! Encoding of a record: a sequence of changes, each
//! `table name length (u8) | table name | op (u8: 1 insert, 2 remove) | key length
//! (u32 LE) | key | value length (u32 LE) | value` (no value for a remove), key and value
//! in redb's own byte encoding of the table's types.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::ops::Deref;

use redb::{AccessGuard, Key, Table, TableDefinition, TableHandle, Value, WriteTransaction};

use super::*;

const INSERT: u8 = 1;
const REMOVE: u8 = 2;

/// The changes a transaction made so far, encoded (see the module's doc).
#[derive(Default)]
pub(super) struct Redo {
    bytes: RefCell<Vec<u8>>,
}

impl Redo {
    /// The record so far, leaving it empty.
    pub(super) fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.bytes.borrow_mut())
    }

    fn note(&self, table: &str, op: u8, key: &[u8], value: Option<&[u8]>) {
        let mut out = self.bytes.borrow_mut();
        // Table names are short constants of this module's parent (a name past 255
        // bytes would be cut here and refused by replay as unknown).
        let name = &table.as_bytes()[..table.len().min(usize::from(u8::MAX))];
        out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(name);
        out.push(op);
        put_bytes(&mut out, key);
        if let Some(value) = value {
            put_bytes(&mut out, value);
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A write transaction as steps see it: tables open as [`Logged`] tables, whose
/// changes go into `redo`.
#[derive(Clone, Copy)]
pub(super) struct Tx<'t> {
    txn: &'t WriteTransaction,
    redo: &'t Redo,
}

impl<'t> Tx<'t> {
    pub(super) fn new(txn: &'t WriteTransaction, redo: &'t Redo) -> Self {
        Tx { txn, redo }
    }

    /// Opens (creating if missing) a table whose changes are recorded.
    pub(super) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<K, V>,
    ) -> std::result::Result<Logged<'t, K, V>, redb::TableError> {
        Ok(Logged {
            name: def.name().to_owned(),
            table: self.txn.open_table(def)?,
            redo: self.redo,
        })
    }
}

/// A table open for writing whose changes are recorded in the transaction's [`Redo`].
/// Reads go to the table itself (`Deref`).
pub(super) struct Logged<'t, K: Key + 'static, V: Value + 'static> {
    name: String,
    table: Table<'t, K, V>,
    redo: &'t Redo,
}

impl<'t, K: Key + 'static, V: Value + 'static> Deref for Logged<'t, K, V> {
    type Target = Table<'t, K, V>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

impl<K: Key + 'static, V: Value + 'static> Logged<'_, K, V> {
    /// `Table::insert`, recorded.
    pub(super) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> std::result::Result<Option<AccessGuard<'_, V>>, redb::StorageError> {
        let (key, value) = (key.borrow(), value.borrow());
        self.redo.note(
            &self.name,
            INSERT,
            K::as_bytes(key).as_ref(),
            Some(V::as_bytes(value).as_ref()),
        );
        self.table.insert(key, value)
    }

    /// `Table::remove`, recorded (also when there was nothing to remove: replaying it
    /// removes nothing either).
    pub(super) fn remove<'a>(
        &mut self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> std::result::Result<Option<AccessGuard<'_, V>>, redb::StorageError> {
        let key = key.borrow();
        self.redo
            .note(&self.name, REMOVE, K::as_bytes(key).as_ref(), None);
        self.table.remove(key)
    }
}

/// Applies a redo record to `txn`: every change, in order, to the table it names.
pub(super) fn replay(txn: &WriteTransaction, mut record: &[u8]) -> Result<()> {
    let corrupt = |why: &str| Error::Corrupt(format!("redo record: {why}"));
    while let Some((&len, rest)) = record.split_first() {
        let (name, rest) = split(rest, usize::from(len)).ok_or_else(|| corrupt("table name"))?;
        let name = std::str::from_utf8(name).map_err(|_| corrupt("table name"))?;
        let (&op, rest) = rest.split_first().ok_or_else(|| corrupt("op"))?;
        let (key, rest) = take_bytes(rest).ok_or_else(|| corrupt("key"))?;
        let (value, rest) = match op {
            INSERT => {
                let (v, rest) = take_bytes(rest).ok_or_else(|| corrupt("value"))?;
                (Some(v), rest)
            }
            REMOVE => (None, rest),
            other => return Err(corrupt(&format!("op {other}"))),
        };
        apply_to_named(txn, name, key, value)?;
        record = rest;
    }
    Ok(())
}

fn split(bytes: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (bytes.len() >= n).then(|| bytes.split_at(n))
}

fn take_bytes(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = split(bytes, 4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?);
    split(rest, usize::try_from(len).ok()?)
}

/// Runs `$found` with `$def` bound to the definition of the table named `$name` (each
/// arm with that table's types), or gives `$unknown`. These are the tables a step may
/// write, the ones a record may name: every table the store creates
/// (`every_table_the_store_creates_can_be_replayed` checks it). `run_timers` is not
/// one: only the version 1 → 2 migration touches it.
macro_rules! by_name {
    ($name:expr, |$def:ident| $found:expr, $unknown:expr) => {
        by_name!(@arms $name, $def, $found, $unknown;
            META, JOBS, PENDING, DUE_INDEX, TRIGGERS, IDEMPOTENCY, IDEMPOTENCY_EXPIRY, RUNS,
            RUNS_BY_JOB, RUNS_BY_CREATED, RUN_COUNTS, TOKENS, ACTIVE, SERIAL, TIMER_INDEX,
            NODE_RUNS, LOGS, LOG_META, NONCES, NONCE_EXPIRY, NODES, NODE_EXPIRY, APPS, AUDIT,
            OUTBOX, OUTBOX_DUE, BREAKERS)
    };
    (@arms $name:expr, $def:ident, $found:expr, $unknown:expr; $($table:ident),+) => {
        match $name {
            $(n if n == $table.name() => {
                let $def = $table;
                $found
            })+
            _ => $unknown,
        }
    };
}

fn apply_to_named(
    txn: &WriteTransaction,
    name: &str,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<()> {
    by_name!(
        name,
        |def| apply(txn, def, key, value),
        Err(Error::Corrupt(format!(
            "redo record: unknown table {name:?}"
        )))
    )
}

/// Whether a record may name the table (see `by_name`).
#[cfg(test)]
fn replayable(name: &str) -> bool {
    by_name!(name, |_def| true, false)
}

fn apply<K: Key + 'static, V: Value + 'static>(
    txn: &WriteTransaction,
    def: TableDefinition<K, V>,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<()> {
    let what = format!("replay into {}", def.name());
    let mut table = txn.open_table(def).ctx(&what)?;
    let key = K::from_bytes(key);
    match value {
        Some(value) => {
            table.insert(key, V::from_bytes(value)).ctx(&what)?;
        }
        None => {
            table.remove(key).ctx(&what)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;

    /// Every entry of the tables a record may name, as (table, key, value) bytes.
    fn dump(db: &Database) -> Vec<(String, Vec<u8>, Vec<u8>)> {
        fn entries<K: Key + 'static, V: Value + 'static>(
            db: &Database,
            def: TableDefinition<K, V>,
            out: &mut Vec<(String, Vec<u8>, Vec<u8>)>,
        ) {
            let txn = db.begin_read().expect("read");
            let Ok(table) = txn.open_table(def) else {
                return;
            };
            for item in table.iter().expect("iter") {
                let (k, v) = item.expect("entry");
                out.push((
                    def.name().to_owned(),
                    K::as_bytes(&k.value()).as_ref().to_vec(),
                    V::as_bytes(&v.value()).as_ref().to_vec(),
                ));
            }
        }
        let mut out = Vec::new();
        entries(db, META, &mut out);
        entries(db, RUNS, &mut out);
        entries(db, TIMER_INDEX, &mut out);
        entries(db, LOG_META, &mut out);
        out
    }

    #[test]
    fn a_replayed_record_makes_the_same_tables() {
        let dir = tempfile::tempdir().expect("temp dir");
        let original = Database::create(dir.path().join("a.redb")).expect("db a");
        let copy = Database::create(dir.path().join("b.redb")).expect("db b");
        let redo = Redo::default();
        let txn = original.begin_write().expect("write");
        {
            let tx = Tx::new(&txn, &redo);
            let mut meta = tx.open_table(META).expect("meta");
            let mut runs = tx.open_table(RUNS).expect("runs");
            let mut timers = tx.open_table(TIMER_INDEX).expect("timers");
            let mut log_meta = tx.open_table(LOG_META).expect("log meta");
            meta.insert("seq", 7).expect("insert");
            meta.insert("seq", u64::MAX).expect("overwrite");
            runs.insert("j@1", "{\"a\":1}").expect("insert");
            runs.insert("j@2", "").expect("insert");
            runs.remove("j@1").expect("remove");
            runs.remove("never there").expect("remove nothing");
            timers.insert((3, -5, "j@2"), ()).expect("insert");
            log_meta.insert("j@2", (1, 2)).expect("insert");
        }
        txn.commit().expect("commit");
        let record = redo.take();
        assert!(redo.take().is_empty(), "take leaves the record empty");

        let txn = copy.begin_write().expect("write");
        replay(&txn, &record).expect("replay");
        txn.commit().expect("commit");
        let want = dump(&original);
        assert_eq!(want.len(), 4, "{want:?}");
        assert_eq!(dump(&copy), want);
    }

    /// A table the store creates but replay does not know would make every record that
    /// writes it unreplayable: the store would refuse to open after a crash.
    #[test]
    fn every_table_the_store_creates_can_be_replayed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.redb");
        drop(EmbeddedStore::open(&path, StoreOptions::default()).expect("open"));
        let db = Database::create(&path).expect("raw open");
        let txn = db.begin_read().expect("read");
        let names: Vec<String> = txn
            .list_tables()
            .expect("tables")
            .map(|t| t.name().to_owned())
            .collect();
        assert!(names.len() >= 27, "{names:?}");
        let unknown: Vec<&String> = names.iter().filter(|n| !replayable(n)).collect();
        assert!(
            unknown.is_empty(),
            "tables replay does not know: {unknown:?}"
        );
        assert!(!replayable("run_timers"));
    }

    #[test]
    fn a_damaged_record_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = Database::create(dir.path().join("a.redb")).expect("db");
        let redo = Redo::default();
        let txn = db.begin_write().expect("write");
        Tx::new(&txn, &redo)
            .open_table(RUNS)
            .expect("runs")
            .insert("j@1", "{}")
            .expect("insert");
        drop(txn);
        let record = redo.take();
        let txn = db.begin_write().expect("write");
        for cut in 1..record.len() {
            let err = replay(&txn, &record[..cut]).expect_err("a cut record");
            assert!(err.to_string().contains("redo record"), "{err}");
        }
        let mut unknown = record.clone();
        unknown[1] = b'x';
        let err = replay(&txn, &unknown).expect_err("an unknown table");
        assert!(err.to_string().contains("unknown table"), "{err}");
    }
}
