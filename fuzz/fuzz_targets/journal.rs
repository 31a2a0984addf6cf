//! The slot journal (`SLOTS/<name>.journal`): any content, a torn tail included, gives the
//! staged sample ids with their CRCs, container files, a complete flag on which the full read
//! and the check from the file's end agree, and the list of failed samples, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("slot.journal", data);
    let name = path.file_name().unwrap().to_str().unwrap();
    let journal = metfs_prefetcher::stager::SlotJournal::of(
        path.parent().unwrap(),
        name.strip_suffix(".journal").unwrap(),
    );
    assert_eq!(journal.path(), path);
    let state = journal.read();
    // A journal without the `complete` line never claims completeness, and the cheap check
    // from the file's end agrees with the full read.
    if state.complete {
        assert!(data.windows(8).any(|w| w == b"complete"));
    }
    assert_eq!(journal.is_complete(), state.complete);
    let _ = (state.staged.len(), state.files.len());
    let _ = journal.failures().len();
});
