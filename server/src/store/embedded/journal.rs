//! The journal: the embedded store's write-ahead file. Each committed batch's redo
//! record is appended to it and made durable (one sequential `fdatasync`) before the
//! batch's transaction commits, so redb can commit without syncing its own file (whose
//! copy-on-write pages lie scattered across it: syncing them cost a burst's writer
//! more than half its time) and sync it only at checkpoints, when the journal starts
//! over.
//!
//! After a crash, the records the file's last durable commit does not contain (their
//! sequence number is above the one it stored) are replayed in order, which yields
//! exactly the state the acknowledged writes made (see `redo`).
//!
//! A record is `payload length (u32 LE) | sequence (u64 LE) | CRC-32 of the length,
//! sequence and payload (u32 LE) | payload`. Records are appended one at a time and each
//! is synced before anyone is answered, so only the last can be torn by a crash: the
//! first record that does not check out ends the journal, and the file is cut there.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const HEADER: usize = 16;

/// The journal file, open for appending.
pub struct Journal {
    file: File,
    /// Where the next record goes (records are written at this offset, never at the
    /// file position, so a cut-back append leaves no gap).
    len: u64,
    /// Where the last record appended starts, until it is cleared or taken back.
    last: Option<u64>,
}

/// A record read back: its sequence number and redo record.
pub struct Record {
    pub seq: u64,
    pub redo: Vec<u8>,
}

impl Journal {
    /// The journal of the store file at `store`: beside it, named `<store>.journal`.
    pub fn path_for(store: &Path) -> PathBuf {
        let mut name = store.as_os_str().to_owned();
        name.push(".journal");
        PathBuf::from(name)
    }

    /// Opens (creating if missing, its owner's only: it holds what the store file
    /// holds) the journal at `path` and reads its records, oldest first. A torn last
    /// record is cut off the file.
    pub fn open(path: &Path) -> io::Result<(Journal, Vec<Record>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, good) = parse(&bytes);
        let len = u64::try_from(good).unwrap_or(u64::MAX);
        if good < bytes.len() {
            tracing::warn!(
                journal = %path.display(),
                dropped_bytes = bytes.len() - good,
                "the journal's last record was torn (a crash while it was written); cut off"
            );
            file.set_len(len)?;
            file.sync_all()?;
        }
        let journal = Journal {
            file,
            len,
            last: None,
        };
        Ok((journal, records))
    }

    /// Appends a record and syncs it. On failure the file is cut back to where it was,
    /// so a later append does not follow a partial record.
    pub fn append(&mut self, seq: u64, redo: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(HEADER + redo.len());
        let len =
            u32::try_from(redo.len()).map_err(|_| io::Error::other("a redo record over 4 GiB"))?;
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&seq.to_le_bytes());
        frame.extend_from_slice(&checksum(len, seq, redo).to_le_bytes());
        frame.extend_from_slice(redo);
        let written = self
            .file
            .write_all_at(&frame, self.len)
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.last = Some(self.len);
                self.len += u64::try_from(frame.len()).unwrap_or(u64::MAX);
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(e)
            }
        }
    }

    /// Takes the last record appended back out (its batch did not commit after all),
    /// synced, so a replay never applies it.
    pub fn undo_last(&mut self) -> io::Result<()> {
        if let Some(start) = self.last.take() {
            self.file.set_len(start)?;
            self.file.sync_data()?;
            self.len = start;
        }
        Ok(())
    }

    /// Bytes in the journal.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Empties the journal: every record in it is in the store file's durable state.
    pub fn clear(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.sync_data()?;
        self.len = 0;
        self.last = None;
        Ok(())
    }
}

fn checksum(len: u32, seq: u64, redo: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(&seq.to_le_bytes());
    h.update(redo);
    h.finalize()
}

/// The records that check out, in order, and how many bytes they take: reading stops
/// at the first that does not (a torn tail) or whose sequence does not follow.
fn parse(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut records: Vec<Record> = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let word = |i: usize| header.get(i..i + 4).and_then(|b| b.try_into().ok());
        let (Some(len), Some(crc)) = (word(0), word(12)) else {
            break;
        };
        let (len, crc) = (u32::from_le_bytes(len), u32::from_le_bytes(crc));
        let Some(seq) = header.get(4..12).and_then(|b| b.try_into().ok()) else {
            break;
        };
        let seq = u64::from_le_bytes(seq);
        let start = at + HEADER;
        let Some(end) = usize::try_from(len).ok().and_then(|l| start.checked_add(l)) else {
            break;
        };
        let Some(redo) = bytes.get(start..end) else {
            break;
        };
        let follows = records.last().is_none_or(|last| seq > last.seq);
        if checksum(len, seq, redo) != crc || !follows {
            break;
        }
        records.push(Record {
            seq,
            redo: redo.to_vec(),
        });
        at = end;
    }
    (records, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_order_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = Journal::path_for(&dir.path().join("s.redb"));
        assert!(path.ends_with("s.redb.journal"), "{path:?}");
        let (mut j, records) = Journal::open(&path).expect("open");
        assert!(records.is_empty());
        j.append(5, b"first").expect("append");
        j.append(6, b"").expect("append an empty record");
        j.append(9, b"third").expect("append");
        let whole = j.len();
        drop(j);
        // A crash in the middle of the next record's write.
        use std::io::Write;
        let mut f = OpenOptions::new().append(true).open(&path).expect("file");
        f.write_all(&[7, 0, 0, 0, 10, 0]).expect("torn bytes");
        drop(f);

        let (mut j, records) = Journal::open(&path).expect("reopen");
        let got: Vec<(u64, &[u8])> = records.iter().map(|r| (r.seq, &r.redo[..])).collect();
        assert_eq!(got, [(5, &b"first"[..]), (6, b""), (9, b"third")]);
        assert_eq!(j.len(), whole, "the torn record is cut off");
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), whole);
        j.append(10, b"after").expect("append after the cut");
        drop(j);
        let (_, records) = Journal::open(&path).expect("reopen");
        assert_eq!(records.last().map(|r| r.seq), Some(10));
    }

    #[test]
    fn a_damaged_or_out_of_order_record_ends_the_journal() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("j");
        let (mut j, _) = Journal::open(&path).expect("open");
        j.append(1, b"one").expect("append");
        j.append(2, b"two").expect("append");
        j.append(2, b"two again").expect("append");
        drop(j);
        let (_, records) = Journal::open(&path).expect("reopen");
        assert_eq!(records.len(), 2, "a sequence that does not follow ends it");

        let mut bytes = std::fs::read(&path).expect("read");
        // The last payload byte of the second record ("two").
        bytes[2 * HEADER + 3 + 3 - 1] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        let (_, records) = Journal::open(&path).expect("reopen");
        assert_eq!(records.len(), 1, "a flipped bit fails its checksum");
    }

    #[test]
    fn undo_last_takes_the_last_record_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("j");
        let (mut j, _) = Journal::open(&path).expect("open");
        j.append(1, b"one").expect("append");
        j.append(2, b"two").expect("append");
        j.undo_last().expect("undo");
        j.undo_last().expect("a second undo takes nothing");
        j.append(3, b"three").expect("append");
        drop(j);
        let (_, records) = Journal::open(&path).expect("reopen");
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 3]);
    }

    #[test]
    fn clear_empties_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("j");
        let (mut j, _) = Journal::open(&path).expect("open");
        j.append(1, b"one").expect("append");
        j.clear().expect("clear");
        assert_eq!(j.len(), 0);
        j.append(2, b"two").expect("append");
        drop(j);
        let (_, records) = Journal::open(&path).expect("reopen");
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [2]);
    }
}
