//! The stager's journal (`SLOTS/<name>.journal`): any content, a torn tail included, gives the
//! staged sample ids with their CRCs and a complete flag, and the list of failed samples, never
//! a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("slot.journal", data);
    let state = prefetcher::stager::read_journal(&path);
    // A journal without the `complete` line never claims completeness.
    if state.complete {
        assert!(data.windows(8).any(|w| w == b"complete"));
    }
    let _ = state.staged.len();
    let name = path.file_name().unwrap().to_str().unwrap();
    let failed = prefetcher::stager::journal_failures(
        path.parent().unwrap(),
        name.strip_suffix(".journal").unwrap(),
    );
    let _ = failed.len();
});
