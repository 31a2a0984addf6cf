//! Stages rows of one HDF5 container, as the daemon does for one mini-epoch; used by
//! `benches/hdf5_staging.sh`.
//!
//! ```text
//! h5_stage SRC_ROOT FILE ROWS_JSON OUT [DATASETS]
//! ```
//!
//! `FILE` is the container's path under `SRC_ROOT`, `ROWS_JSON` a file holding a JSON list of
//! ascending row indices, `DATASETS` an optional comma-separated list of row datasets.
//! Prints one JSON line: rows, output bytes, row bytes read, and the seconds spent opening and
//! staging (fsync included, as the stager does before renaming).

use std::path::Path;
use std::time::Instant;

use metfs_prefetcher::hdf5::{open_containers, stage_rows};
use metfs_tier::pacer::Pacer;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: h5_stage SRC_ROOT FILE ROWS_JSON OUT [DATASETS]");
        std::process::exit(2);
    }
    let rows: Vec<u64> = serde_json::from_str(
        &std::fs::read_to_string(&args[2]).unwrap_or_else(|e| panic!("{}: {e}", args[2])),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", args[2]));
    let names: Option<Vec<String>> = args
        .get(4)
        .map(|s| s.split(',').map(str::to_string).collect());
    let t0 = Instant::now();
    let c = open_containers(
        Path::new(&args[0]),
        std::slice::from_ref(&args[1]),
        names.as_deref(),
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let open_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let out = Path::new(&args[3]);
    let bytes =
        stage_rows(&c, 0, &rows, out, &Pacer::unlimited()).unwrap_or_else(|e| panic!("{e}"));
    std::fs::File::open(out)
        .and_then(|f| f.sync_all())
        .unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let stage_s = t1.elapsed().as_secs_f64();
    println!(
        "{{\"rows\": {}, \"out_bytes\": {bytes}, \"row_bytes\": {}, \"open_s\": {open_s:.4}, \"stage_s\": {stage_s:.4}}}",
        rows.len(),
        rows.len() as u64 * c.files()[0].row_bytes
    );
}
