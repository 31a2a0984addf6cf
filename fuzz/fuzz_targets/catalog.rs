//! The saved catalog (`catalog.bin` in the cache directory): a damaged file is refused as
//! corrupt, and a catalog it accepts must be usable, never a panic or a huge allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metfs_tier::catalog::Catalog;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let path = common::scratch("catalog.bin", data);
    if let Ok(cat) = Catalog::load(&path) {
        let _ = (cat.total_bytes(), cat.dir_count(), cat.source());
        for id in 0..cat.len() as u32 {
            let p = cat.path(id);
            let _ = (
                cat.dir_and_name(id),
                cat.size(id),
                cat.version(id),
                cat.find(&p),
                cat.meta(id),
            );
            if let Some(l) = cat.labels() {
                let _ = cat.label_name(l[id as usize]);
            }
            if let Some(c) = cat.clusters() {
                let _ = cat.cluster_name(c[id as usize]);
            }
        }
    }
});
