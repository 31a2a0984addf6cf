//! litdata optimized directories (`litdata.optimize`, `litdata.streaming.BinaryWriter`).
//!
//! `index.json` holds `{"chunks": [...], "config": {...}, "updated_at": "..."}`; each chunk
//! entry names its file (`filename`, `chunk-0-0.bin`) with its item count (`chunk_size`), bytes
//! (`chunk_bytes`) and token count (`dim`, for the token loader). `config` describes the
//! writer's settings (compression, data format, the chunk size it aimed at), not the dataset's
//! totals.
//!
//! What litdata checks (read in its source, 0.2.76, `litdata/streaming/config.py`,
//! `item_loader.py`, `utilities/dataset_utilities.py`): `StreamingDataset(input_dir=DIR)` loads
//! `chunks` and `config`, asserts at least one chunk, and builds its intervals by adding each
//! kept chunk's `chunk_size` (`dim / block_size` for `TokensLoader`) in `chunks`' order. No total
//! and no per-chunk consistency between entries is checked, so an index of the view's entries,
//! each unchanged, is consistent. `updated_at` names litdata's cache directory for the input
//! directory (`_try_create_cache_dir`: remote and Lightning paths, and compressed chunks on
//! shared filesystems); a view's `updated_at` is derived from the source's and the view's
//! chunks (as the `datasets` fingerprint is), so two views at one mount path never share a
//! cache directory. An index without `updated_at` keeps none.
//!
//! The rewritten `index.json` differs from the source's in `chunks` (the view's entries, each as
//! in the source, in the source's order) and `updated_at` only.

use crate::{is_inside, to_bytes, view_fingerprint, Shard};
use serde_json::Value;
use std::collections::BTreeSet;

/// What is wrong with a litdata index.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field missing or of the wrong kind.
    #[error("{file}: {what}")]
    Field { file: String, what: String },
    /// A chunk whose file is not in the listing.
    #[error("{file}: names the chunk '{shard}', which is not in the listing")]
    MissingShard { file: String, shard: String },
    /// A file name that leaves the directory or is not a plain relative path.
    #[error("{file}: names '{name}', which is not a plain relative path inside the dataset")]
    BadName { file: String, name: String },
    /// A chunk named twice.
    #[error("{file}: names the chunk '{shard}' twice")]
    Repeated { file: String, shard: String },
}

/// Whether a parsed `index.json` is a litdata index (`chunks` list and `config` object).
pub fn is_litdata(value: &Value) -> bool {
    value.get("chunks").is_some_and(Value::is_array)
        && value.get("config").is_some_and(Value::is_object)
}

/// One parsed litdata `index.json`.
#[derive(Clone, Debug)]
pub struct Index {
    path: String,
    value: Value,
    entries: Vec<Value>,
    shards: Vec<Shard>,
}

fn field(file: &str, what: impl Into<String>) -> Error {
    Error::Field {
        file: file.into(),
        what: what.into(),
    }
}

impl Index {
    /// Parses the litdata index at `path`; each chunk's file must be in `files`.
    pub fn parse(path: &str, value: Value, files: &BTreeSet<&str>) -> Result<Index, Error> {
        if !value.get("config").is_some_and(Value::is_object) {
            return Err(field(path, "has no `config` object"));
        }
        if value.get("updated_at").is_some_and(|u| !u.is_string()) {
            return Err(field(path, "`updated_at` is not a string"));
        }
        let entries = value
            .get("chunks")
            .and_then(Value::as_array)
            .ok_or_else(|| field(path, "has no `chunks` list"))?
            .clone();
        let mut seen = BTreeSet::new();
        let mut shards = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let name = e
                .get("filename")
                .and_then(Value::as_str)
                .ok_or_else(|| field(path, format!("`chunks[{i}]` has no `filename` string")))?;
            if !is_inside(name) {
                return Err(Error::BadName {
                    file: path.into(),
                    name: name.into(),
                });
            }
            if !files.contains(name) {
                return Err(Error::MissingShard {
                    file: path.into(),
                    shard: name.into(),
                });
            }
            if !seen.insert(name) {
                return Err(Error::Repeated {
                    file: path.into(),
                    shard: name.into(),
                });
            }
            shards.push(Shard {
                name: name.into(),
                files: vec![name.into()],
            });
        }
        if shards.is_empty() {
            return Err(field(path, "`chunks` is empty"));
        }
        Ok(Index {
            path: path.into(),
            value,
            entries,
            shards,
        })
    }

    /// The index file's name.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The chunks, as shards, in `chunks`' order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The index of a view that keeps the chunks at positions `keep` (ascending).
    pub fn rewrite(&self, keep: &[usize]) -> Result<Vec<u8>, Error> {
        if keep.is_empty() {
            return Err(field(&self.path, "a view holds at least one chunk"));
        }
        let mut value = self.value.clone();
        value["chunks"] = Value::Array(keep.iter().map(|&i| self.entries[i].clone()).collect());
        if let Some(Value::String(at)) = value.get("updated_at") {
            let names: Vec<&str> = keep.iter().map(|&i| self.shards[i].name.as_str()).collect();
            let derived = format!("{at}-{}", view_fingerprint(at, &names));
            value["updated_at"] = Value::String(derived);
        }
        // litdata writes its index with sorted keys, as serde_json's map does.
        Ok(to_bytes(&value, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn index(n: usize) -> Value {
        json!({
            "chunks": (0..n).map(|i| json!({
                "chunk_bytes": 1000 + i, "chunk_size": 10 + i, "dim": null,
                "filename": format!("chunk-0-{i}.bin"),
            })).collect::<Vec<_>>(),
            "config": {"chunk_bytes": null, "chunk_size": 10, "compression": null, "data_format": ["int", "bytes"]},
            "updated_at": "1718000000.5",
        })
    }

    #[test]
    fn a_view_keeps_config_and_derives_updated_at() {
        let files: BTreeSet<&str> = ["chunk-0-0.bin", "chunk-0-1.bin", "chunk-0-2.bin"]
            .into_iter()
            .collect();
        let idx = Index::parse("index.json", index(3), &files).unwrap();
        let out: Value = serde_json::from_slice(&idx.rewrite(&[0, 2]).unwrap()).unwrap();
        assert_eq!(out["config"], index(3)["config"]);
        assert_eq!(
            out["chunks"],
            json!([index(3)["chunks"][0], index(3)["chunks"][2]])
        );
        let at = out["updated_at"].as_str().unwrap();
        assert!(at.starts_with("1718000000.5-"), "{at}");
        let other: Value = serde_json::from_slice(&idx.rewrite(&[0, 1]).unwrap()).unwrap();
        assert_ne!(other["updated_at"], out["updated_at"]);
    }

    #[test]
    fn bad_indexes_are_named() {
        let files: BTreeSet<&str> = ["chunk-0-0.bin"].into_iter().collect();
        let missing = Index::parse("index.json", index(2), &files).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "index.json: names the chunk 'chunk-0-1.bin', which is not in the listing"
        );
        let mut no_config = index(1);
        no_config.as_object_mut().unwrap().remove("config");
        assert_eq!(
            Index::parse("index.json", no_config, &files)
                .unwrap_err()
                .to_string(),
            "index.json: has no `config` object"
        );
        let mut bad = index(1);
        bad["chunks"][0]["filename"] = json!("a/../../x");
        assert!(matches!(
            Index::parse("index.json", bad, &files),
            Err(Error::BadName { .. })
        ));
    }
}
