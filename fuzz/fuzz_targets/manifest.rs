//! The manifest reader (CSV or JSON lines, by extension or sniffed): any file gives a catalog
//! or an error naming the file, never a panic. A catalog it accepts must be usable: every
//! sample's path found again, sizes summed.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the extension, so both parsers and the sniffer are reached.
    let (ext, body) = match data.split_first() {
        Some((b, rest)) => (
            match b % 3 {
                0 => "csv",
                1 => "jsonl",
                _ => "manifest",
            },
            rest,
        ),
        None => ("manifest", data),
    };
    let path = common::scratch(&format!("manifest.{ext}"), body);
    match metfs_prefetcher::manifest::load_catalog(&path) {
        Ok(cat) => {
            let _ = cat.total_bytes();
            for id in 0..cat.len() as u32 {
                let p = cat.path(id);
                assert_eq!(cat.find(&p), Some(id), "sample {p} not found again");
                let _ = (cat.size(id), cat.version(id));
            }
        }
        Err(e) => {
            assert!(
                e.to_string().contains(&path.display().to_string()),
                "error does not name the file: {e}"
            );
        }
    }
});
