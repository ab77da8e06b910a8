//! How much one listing answer may hold. gRPC clients refuse an answer past 4 MiB
//! unless told otherwise, and a run's output alone may be 1 MiB, so a listing stops
//! adding items once their encoded size would pass [`MAX_LIST_BYTES`] (it always keeps
//! one), and its page token continues right after the last item it kept: a page may
//! be shorter than its `page_size` while more follow.

use prost::Message;

/// What the items of one listing answer may take, encoded: room for the rest of the
/// answer under gRPC's default 4 MiB.
pub const MAX_LIST_BYTES: usize = 3 * 1024 * 1024;

/// The room left in one answer.
#[derive(Debug)]
pub struct Budget {
    left: usize,
    empty: bool,
}

impl Budget {
    pub fn new(bytes: usize) -> Self {
        Budget {
            left: bytes,
            empty: true,
        }
    }

    /// Whether `item` still fits, taking its room if so. The first item always fits (a
    /// listing that could hold none would never advance).
    pub fn take(&mut self, item: &impl Message) -> bool {
        // The item's bytes, its field tag and its length prefix.
        let len = item.encoded_len();
        let size = len + 1 + prost::length_delimiter_len(len);
        if size > self.left && !self.empty {
            return false;
        }
        self.left = self.left.saturating_sub(size);
        self.empty = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_fit_until_the_room_is_spent_and_the_first_always_does() {
        let item = |n: usize| sundial_proto::v1::LogLine {
            message: "x".repeat(n),
            ..Default::default()
        };
        let mut b = Budget::new(100);
        assert!(b.take(&item(500)), "the first fits whatever its size");
        assert!(!b.take(&item(0)), "nothing is left after it");

        let mut b = Budget::new(100);
        assert!(b.take(&item(40)));
        assert!(b.take(&item(40)));
        assert!(!b.take(&item(40)), "120 bytes and more do not fit in 100");
        assert!(b.take(&item(1)), "a small one still does");
    }
}
