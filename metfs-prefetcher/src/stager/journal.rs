//! The slot journal, `SLOTS/<slot>.journal`: what a slot holds, read back on resume. Every
//! reader and writer goes through [`SlotJournal`] (the stager, container staging, the daemon's
//! wait for an aggregate inbox, the exchange that fills the inbox), so the format, its file
//! name and the rule for "complete" live here once.
//!
//! Format, one entry per line:
//! * `<id> <crc32>`: sample `id` is in the slot, and its copy has this CRC-32 (hex);
//! * `file <index> <bytes> <crc32>`: container mode, container file `index` is staged;
//! * `failed <id>`: sample `id` was left out for a reason of its own (reported, not refetched);
//! * `complete`: written last, then the file is synced. A journal is complete when its last
//!   line is `complete`: [`SlotJournal::read`] and the cheap [`SlotJournal::is_complete`] (which
//!   reads only the file's end, for a poll) apply this one rule.
//!
//! A batch of fetched copies (or a container file) is journaled once it is durable and before
//! its renames, so that no fetched copy sits in a slot without an entry: a crash between the two
//! leaves entries whose copies never left `tmp/`, which resume finds missing and fetches (it
//! checks every journaled copy unless the slot was sealed complete, and `complete` follows every
//! rename). Samples linked from another slot are journaled after their links; a crash between
//! them costs the links again, not a fetch. A `failed` line after a sample's entry withdraws it
//! (a rename refused after its batch was journaled). A torn last line (a crash mid-write) is
//! ignored, which costs a refetch of one sample at most. Entries without a CRC (written before
//! journals had one) are ignored too: their copies cannot be checked, so they are fetched again.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What a slot's journal says.
#[derive(Debug, Default)]
pub struct JournalState {
    /// Staged sample ids with the CRC-32 of their copy.
    pub staged: HashMap<u32, u32>,
    /// Staged container files (container mode): index -> (bytes, CRC-32).
    pub files: HashMap<usize, (u64, u32)>,
    /// Samples left out of the slot.
    pub failed: Vec<u32>,
    /// The slot was staged to the end.
    pub complete: bool,
}

/// The journal of one slot (see the module doc).
#[derive(Debug, Clone)]
pub struct SlotJournal {
    path: PathBuf,
}

impl SlotJournal {
    /// The journal of slot `slot` in the slots directory `slots_dir`.
    pub fn of(slots_dir: &Path, slot: &str) -> Self {
        Self {
            path: slots_dir.join(format!("{slot}.journal")),
        }
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads it. A missing or unreadable journal means nothing is staged.
    pub fn read(&self) -> JournalState {
        let mut out = JournalState::default();
        let Ok(f) = std::fs::File::open(&self.path) else {
            return out;
        };
        let mut last_complete = false;
        // A sample's last entry decides: a sample left out, then staged by a later staging of
        // the slot (a deferred sample given at a resume), is staged, not failed.
        let mut failed: std::collections::HashSet<u32> = Default::default();
        // Lines as bytes: a line that is not UTF-8 (a torn write) is a line like any other,
        // ignored as an entry, so that the last line is the same one `is_complete` sees.
        for line in std::io::BufReader::new(f)
            .split(b'\n')
            .map_while(Result::ok)
        {
            let Ok(line) = std::str::from_utf8(&line) else {
                last_complete = false;
                continue;
            };
            last_complete = line == "complete";
            if last_complete {
                continue;
            }
            if let Some(id) = line.strip_prefix("failed ") {
                if let Ok(id) = id.parse() {
                    out.staged.remove(&id);
                    if failed.insert(id) {
                        out.failed.push(id);
                    }
                }
            } else if let Some(rest) = line.strip_prefix("file ") {
                let mut it = rest.split_whitespace();
                if let (Some(i), Some(n), Some(c), None) =
                    (it.next(), it.next(), it.next(), it.next())
                {
                    if let (Ok(i), Ok(n), Ok(c)) =
                        (i.parse(), n.parse(), u32::from_str_radix(c, 16))
                    {
                        out.files.insert(i, (n, c));
                    }
                }
            } else if let Some((id, crc)) = line.split_once(' ') {
                if let (Ok(id), Ok(crc)) = (id.parse::<u32>(), u32::from_str_radix(crc, 16)) {
                    if failed.remove(&id) {
                        out.failed.retain(|&f| f != id);
                    }
                    out.staged.insert(id, crc);
                }
            }
        }
        out.complete = last_complete;
        out
    }

    /// Whether its last line is `complete`, read from the file's end, so that polling a journal
    /// of many thousand entries does not read it whole every time.
    pub fn is_complete(&self) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return false;
        };
        let Ok(len) = f.seek(SeekFrom::End(0)) else {
            return false;
        };
        // Enough for `\ncomplete\n`.
        let take = len.min(10);
        let mut tail = vec![0u8; take as usize];
        if f.seek(SeekFrom::End(-(take as i64))).is_err() || f.read_exact(&mut tail).is_err() {
            return false;
        }
        let tail = tail.strip_suffix(b"\n").unwrap_or(&tail);
        let last = tail.rsplit(|&b| b == b'\n').next().unwrap_or(tail);
        last == b"complete" && (tail.len() > last.len() || take == len)
    }

    /// Samples recorded as left out of the slot.
    pub fn failures(&self) -> Vec<u32> {
        self.read().failed
    }

    /// Deletes it (nothing to do if it is gone).
    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Opens it for appending (created private if missing).
    pub fn append(&self) -> std::io::Result<JournalWriter> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)?;
        Ok(JournalWriter { file })
    }
}

/// Entries to append in one write (a batch of committed samples is journaled at once).
#[derive(Debug, Default)]
pub struct JournalBatch(String);

impl JournalBatch {
    /// An empty batch with room for about `entries` entries.
    pub fn with_capacity(entries: usize) -> Self {
        Self(String::with_capacity(entries * 20))
    }
    /// Sample `id` is in the slot with a copy of CRC-32 `crc`.
    pub fn staged(&mut self, id: u32, crc: u32) {
        self.0.push_str(&format!("{id} {crc:08x}\n"));
    }
    /// Sample `id` was left out of the slot.
    pub fn failed(&mut self, id: u32) {
        self.0.push_str(&format!("failed {id}\n"));
    }
    /// Container file `index` is staged, `bytes` long with CRC-32 `crc`.
    pub fn file(&mut self, index: usize, bytes: u64, crc: u32) {
        self.0
            .push_str(&format!("file {index} {bytes} {crc:08x}\n"));
    }
    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A journal open for appending.
#[derive(Debug)]
pub struct JournalWriter {
    file: std::fs::File,
}

impl JournalWriter {
    /// Appends `batch`'s entries.
    pub fn write(&mut self, batch: &JournalBatch) -> std::io::Result<()> {
        self.file.write_all(batch.0.as_bytes())
    }

    /// Appends one entry of a sample in the slot.
    pub fn staged(&mut self, id: u32, crc: u32) -> std::io::Result<()> {
        let mut b = JournalBatch::default();
        b.staged(id, crc);
        self.write(&b)
    }

    /// Ends the journal with `complete` and makes it durable.
    pub fn complete(mut self) -> std::io::Result<()> {
        self.file.write_all(b"complete\n")?;
        self.file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_written_are_read_back_and_complete_is_the_last_line() {
        let d = tempfile::tempdir().unwrap();
        let j = SlotJournal::of(d.path(), "e000001-m00002");
        assert_eq!(j.path(), d.path().join("e000001-m00002.journal"));
        assert!(!j.read().complete && !j.is_complete(), "a missing journal");
        let mut w = j.append().unwrap();
        let mut b = JournalBatch::with_capacity(3);
        b.staged(7, 0xdead_beef);
        b.staged(9, 1);
        b.file(2, 4096, 0xabc);
        w.write(&b).unwrap();
        let mut b = JournalBatch::default();
        b.failed(11);
        w.write(&b).unwrap();
        let s = j.read();
        assert_eq!(s.staged, HashMap::from([(7, 0xdead_beef), (9, 1)]));
        assert_eq!(s.files, HashMap::from([(2, (4096, 0xabc))]));
        assert_eq!(s.failed, vec![11]);
        assert!(!s.complete && !j.is_complete());
        w.complete().unwrap();
        assert!(j.read().complete && j.is_complete());
        assert_eq!(j.failures(), vec![11]);
        j.remove().unwrap();
        j.remove().unwrap();
        assert!(!j.path().exists());
    }

    /// A `failed` line withdraws an earlier entry of the same sample: its batch was journaled
    /// before a rename that was then refused.
    #[test]
    fn a_failed_line_withdraws_the_sample() {
        let d = tempfile::tempdir().unwrap();
        let j = SlotJournal::of(d.path(), "s");
        std::fs::write(j.path(), "1 0000abcd\n2 0000abce\nfailed 2\ncomplete\n").unwrap();
        let s = j.read();
        assert_eq!(s.staged, HashMap::from([(1, 0xabcd)]));
        assert_eq!(s.failed, vec![2]);
        assert!(s.complete);
    }

    /// The last entry of a sample decides: left out by one staging of the slot and given by a
    /// later one (a deferred sample fetched at a resume), it is staged, and listed once.
    #[test]
    fn a_sample_staged_after_it_failed_is_staged() {
        let d = tempfile::tempdir().unwrap();
        let j = SlotJournal::of(d.path(), "s");
        std::fs::write(
            j.path(),
            "1 0000abcd\nfailed 2\nfailed 3\ncomplete\nfailed 3\n2 0000abce\ncomplete\n",
        )
        .unwrap();
        let s = j.read();
        assert_eq!(s.staged, HashMap::from([(1, 0xabcd), (2, 0xabce)]));
        assert_eq!(s.failed, vec![3]);
        assert!(s.complete);
    }

    /// The full read and the tail check agree on every ending, torn lines included.
    #[test]
    fn both_readers_apply_one_rule() {
        let d = tempfile::tempdir().unwrap();
        let j = SlotJournal::of(d.path(), "s");
        for (text, complete) in [
            ("", false),
            ("complete\n", true),
            ("complete", true),
            ("1 0000abcd\ncomplete\n", true),
            ("1 0000abcd\ncomplete", true),
            ("1 0000abcd\n", false),
            ("complete\n1 0000abcd\n", false),
            ("1 0000abcd\nxcomplete\n", false),
            ("1 0000abcd\ncompl", false),
            ("incomplete\n", false),
            ("complete\n\n", false),
        ] {
            std::fs::write(j.path(), text).unwrap();
            assert_eq!(j.read().complete, complete, "{text:?}");
            assert_eq!(j.is_complete(), complete, "{text:?}");
        }
        // A torn last line that is not UTF-8 (found by the fuzz target).
        std::fs::write(j.path(), b"complete\n\xf4").unwrap();
        assert!(!j.read().complete && !j.is_complete());
    }
}
