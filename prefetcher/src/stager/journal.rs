//! The slot journal: one line per committed sample (`<id> <crc32>`), `failed <id>` lines and a
//! final `complete`, read back on resume.

use super::*;

/// What a slot's journal says.
#[derive(Debug, Default)]
pub struct JournalState {
    /// Staged sample ids with the CRC-32 of their copy.
    pub staged: HashMap<u32, u32>,
    /// The slot was staged to the end.
    pub complete: bool,
}

/// Reads a journal. A missing or unreadable journal means nothing is staged; unparsable lines
/// (a torn last line after a crash) are ignored, and so are entries without a CRC (written
/// before journals had one: their copies cannot be checked, so they are fetched again).
pub fn read_journal(path: &Path) -> JournalState {
    let mut out = JournalState::default();
    if let Ok(f) = std::fs::File::open(path) {
        for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
            if line == "complete" {
                out.complete = true;
            } else if let Some((id, crc)) = line.split_once(' ') {
                if let (Ok(id), Ok(crc)) = (id.parse::<u32>(), u32::from_str_radix(crc, 16)) {
                    out.staged.insert(id, crc);
                }
            }
        }
    }
    out
}

/// Failed sample ids recorded in a complete slot's journal.
pub fn journal_failures(slots_dir: &Path, name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(f) = std::fs::File::open(slots_dir.join(format!("{name}.journal"))) {
        for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
            if let Some(id) = line.strip_prefix("failed ").and_then(|s| s.parse().ok()) {
                out.push(id);
            }
        }
    }
    out
}
