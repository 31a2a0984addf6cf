//! Builds one view of a sharded dataset in a directory, as a mount would show it.
//!
//! ```text
//! view_index [--format NAME] [--always-split SPLIT]... SRC_DIR OUT_DIR SHARD...
//! view_index [--format NAME] [--always-split SPLIT]... --list SRC_DIR
//! ```
//!
//! Lists SRC_DIR, reads the index files the format needs, detects the format (or takes
//! `--format`: hf-dataset, hf-dataset-dict, mds, litdata, webdataset, tfrecord), then
//! hard-links (or, across filesystems, copies) the always files and the named shards' files into
//! OUT_DIR and writes the rewritten index files there. A SHARD is a shard's name or any of its
//! files. `--list` prints the layout as JSON instead. Prints the view as one JSON line; exits 2
//! with the error on bad input.
//!
//! The arguments are parsed by hand: six flags do not justify a CLI crate in the library's
//! build.

use metfs_formats::{detect, layout, wanted, Format, Layout, Options};
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn list(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            list(root, &e.path(), out)?;
        } else if t.is_file() {
            let rel = e
                .path()
                .strip_prefix(root)
                .expect("below the root")
                .to_path_buf();
            out.push(
                rel.to_str()
                    .ok_or_else(|| std::io::Error::other(format!("{rel:?}: not UTF-8")))?
                    .into(),
            );
        }
    }
    Ok(())
}

fn place(src: &Path, dst: &Path) -> std::io::Result<()> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    if fs::hard_link(src, dst).is_err() {
        fs::copy(src, dst)?;
    }
    Ok(())
}

fn layout_json(l: &Layout) -> serde_json::Value {
    json!({
        "format": l.format().name(),
        "index": l.index_files(),
        "always": l.always(),
        "shards": l.shards().iter().map(|s| json!({"name": s.name, "files": s.files})).collect::<Vec<_>>(),
        "other": l.other(),
    })
}

fn run(args: Vec<String>) -> Result<(), String> {
    let mut format = None;
    let mut options = Options::default();
    let mut list_only = false;
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--format" => {
                let name = it.next().ok_or("--format needs a name")?;
                format = Some(
                    Format::from_name(&name).ok_or(format!("--format {name}: no such format"))?,
                );
            }
            "--always-split" => options
                .always_splits
                .push(it.next().ok_or("--always-split needs a split")?),
            "--list" => list_only = true,
            _ => rest.push(a),
        }
    }
    let usage =
        "usage: view_index [--format NAME] [--always-split SPLIT]... SRC_DIR OUT_DIR SHARD... \
                 | view_index [--format NAME] --list SRC_DIR";
    if rest.is_empty() || (list_only && rest.len() != 1) || (!list_only && rest.len() < 3) {
        return Err(usage.into());
    }
    let src = PathBuf::from(&rest[0]);
    let mut files = Vec::new();
    list(&src, &src, &mut files).map_err(|e| format!("{}: {e}", src.display()))?;
    files.sort();
    let mut indexes = BTreeMap::new();
    for f in wanted(&files) {
        let bytes =
            fs::read(src.join(&f)).map_err(|e| format!("{}: {e}", src.join(&f).display()))?;
        indexes.insert(f, bytes);
    }
    let l = match format {
        Some(f) => layout(f, &files, &indexes, &options).map_err(|e| e.to_string()),
        None => match detect(&files, &indexes, &options) {
            Ok(Some(l)) => Ok(l),
            Ok(None) => Err("none of the formats detected".to_string()),
            Err(e) => Err(e.to_string()),
        },
    }
    .map_err(|e| format!("{}: {e}", src.display()))?;
    if list_only {
        println!("{}", layout_json(&l));
        return Ok(());
    }
    let out = PathBuf::from(&rest[1]);
    let view = l
        .view(&rest[2..])
        .map_err(|e| format!("{}: {e}", src.display()))?;
    for f in &view.files {
        place(&src.join(f), &out.join(f)).map_err(|e| format!("{f}: {e}"))?;
    }
    for (f, bytes) in &view.indexes {
        fs::write(out.join(f), bytes).map_err(|e| format!("{}: {e}", out.join(f).display()))?;
    }
    println!(
        "{}",
        json!({
            "format": l.format().name(),
            "shards": view.shards.iter().map(|&i| &l.shards()[i].name).collect::<Vec<_>>(),
            "files": view.files,
            "indexes": view.indexes.iter().map(|(f, _)| f).collect::<Vec<_>>(),
        })
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("view_index: {e}");
            ExitCode::from(2)
        }
    }
}
