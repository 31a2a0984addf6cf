//! MosaicML Streaming (MDS) directories.
//!
//! `index.json` holds `{"version": 2, "shards": [...]}`; each shard entry names its file in
//! `raw_data.basename` (`shard.00000.mds`) and, when the writer compressed it, the compressed
//! file in `zip_data.basename` (`shard.00000.mds.zstd`), with its sample count, columns and
//! hashes. `StreamingDataset(local=DIR, remote=None)` reads the shards in `shards`' order and
//! counts samples from the entries, so an index of the view's entries is all it needs.
//!
//! A shard's files are those of `raw_data` and `zip_data` that are in the listing: at least
//! one must be. Streaming decompresses a shard kept only compressed into its local directory,
//! which a read-only view cannot take: such a view needs the raw files (see the crate docs).
//!
//! The rewritten `index.json` differs from the source's only in `shards` (the view's entries,
//! each as in the source, in the source's order).

use crate::{is_inside, to_bytes, Shard};
use serde_json::Value;
use std::collections::BTreeSet;

/// What is wrong with an MDS index.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field missing or of the wrong kind.
    #[error("{file}: {what}")]
    Field { file: String, what: String },
    /// A shard none of whose files is in the listing.
    #[error("{file}: names the shard '{shard}', and no file of it is in the listing")]
    MissingShard { file: String, shard: String },
    /// A basename that leaves the directory or is not a plain relative path.
    #[error("{file}: names '{name}', which is not a plain relative path inside the dataset")]
    BadName { file: String, name: String },
    /// A shard file named twice.
    #[error("{file}: names the shard file '{shard}' twice")]
    Repeated { file: String, shard: String },
}

/// Whether a parsed `index.json` is an MDS index (it has a `shards` list).
pub fn is_mds(value: &Value) -> bool {
    value.get("shards").is_some_and(Value::is_array)
}

/// One parsed MDS `index.json`.
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
    /// Parses the MDS index at `path`; each shard must have a file in `files`.
    pub fn parse(path: &str, value: Value, files: &BTreeSet<&str>) -> Result<Index, Error> {
        let entries = value
            .get("shards")
            .and_then(Value::as_array)
            .ok_or_else(|| field(path, "has no `shards` list"))?
            .clone();
        let mut seen = BTreeSet::new();
        let mut shards = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let raw = e
                .get("raw_data")
                .and_then(|r| r.get("basename"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    field(
                        path,
                        format!("`shards[{i}]` has no `raw_data.basename` string"),
                    )
                })?;
            let zip = match e.get("zip_data") {
                None | Some(Value::Null) => None,
                Some(z) => Some(z.get("basename").and_then(Value::as_str).ok_or_else(|| {
                    field(
                        path,
                        format!("`shards[{i}].zip_data` has no `basename` string"),
                    )
                })?),
            };
            let mut mine = Vec::new();
            for name in std::iter::once(raw).chain(zip) {
                if !is_inside(name) {
                    return Err(Error::BadName {
                        file: path.into(),
                        name: name.into(),
                    });
                }
                if !seen.insert(name) {
                    return Err(Error::Repeated {
                        file: path.into(),
                        shard: name.into(),
                    });
                }
                if files.contains(name) {
                    mine.push(name.to_string());
                }
            }
            if mine.is_empty() {
                return Err(Error::MissingShard {
                    file: path.into(),
                    shard: raw.into(),
                });
            }
            shards.push(Shard {
                name: raw.into(),
                files: mine,
            });
        }
        if shards.is_empty() {
            return Err(field(path, "`shards` is empty"));
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

    /// The shards, in `shards`' order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The index of a view that keeps the shards at positions `keep` (ascending).
    pub fn rewrite(&self, keep: &[usize]) -> Result<Vec<u8>, Error> {
        if keep.is_empty() {
            return Err(field(&self.path, "a view holds at least one shard"));
        }
        let mut value = self.value.clone();
        value["shards"] = Value::Array(keep.iter().map(|&i| self.entries[i].clone()).collect());
        Ok(to_bytes(&value, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(i: usize, zip: bool) -> Value {
        json!({
            "column_encodings": ["int", "bytes"],
            "column_names": ["id", "data"],
            "column_sizes": [8, null],
            "compression": if zip { json!("zstd") } else { Value::Null },
            "format": "mds",
            "hashes": [],
            "raw_data": {"basename": format!("shard.{i:05}.mds"), "bytes": 100, "hashes": {}},
            "samples": 10,
            "size_limit": 4096,
            "version": 2,
            "zip_data": if zip { json!({"basename": format!("shard.{i:05}.mds.zstd"), "bytes": 50, "hashes": {}}) } else { Value::Null },
        })
    }

    #[test]
    fn raw_and_compressed_files_are_one_shard() {
        let files: BTreeSet<&str> = [
            "shard.00000.mds",
            "shard.00000.mds.zstd",
            "shard.00001.mds.zstd",
        ]
        .into_iter()
        .collect();
        let idx = Index::parse(
            "index.json",
            json!({"version": 2, "shards": [entry(0, true), entry(1, true)]}),
            &files,
        )
        .unwrap();
        assert_eq!(
            idx.shards()[0].files,
            ["shard.00000.mds", "shard.00000.mds.zstd"]
        );
        assert_eq!(idx.shards()[1].files, ["shard.00001.mds.zstd"]);
        let out: Value = serde_json::from_slice(&idx.rewrite(&[1]).unwrap()).unwrap();
        assert_eq!(out, json!({"version": 2, "shards": [entry(1, true)]}));
    }

    #[test]
    fn bad_indexes_are_named() {
        let files: BTreeSet<&str> = ["shard.00000.mds"].into_iter().collect();
        let missing = Index::parse(
            "index.json",
            json!({"shards": [entry(0, false), entry(1, false)]}),
            &files,
        );
        assert_eq!(
            missing.unwrap_err().to_string(),
            "index.json: names the shard 'shard.00001.mds', and no file of it is in the listing"
        );
        let mut bad = entry(0, false);
        bad["raw_data"]["basename"] = json!("/etc/passwd");
        assert!(matches!(
            Index::parse("index.json", json!({"shards": [bad]}), &files),
            Err(Error::BadName { .. })
        ));
        let no_name = Index::parse("index.json", json!({"shards": [{"raw_data": {}}]}), &files);
        assert_eq!(
            no_name.unwrap_err().to_string(),
            "index.json: `shards[0]` has no `raw_data.basename` string"
        );
        let twice = Index::parse(
            "index.json",
            json!({"shards": [entry(0, false), entry(0, false)]}),
            &files,
        );
        assert!(matches!(twice, Err(Error::Repeated { .. })));
    }
}
