//! Hugging Face `datasets` directories written by `save_to_disk`.
//!
//! A `Dataset` directory holds `state.json` (its arrow files in `_data_files`, its
//! `_fingerprint`, split and format), `dataset_info.json` (features, description, split sizes)
//! and the arrow files, `data-00000-of-00008.arrow` and so on. `load_from_disk` concatenates the
//! arrow files in `_data_files`' order; it checks no count against `dataset_info.json`, whose
//! split sizes therefore still describe the whole dataset in a view.
//!
//! A `DatasetDict` directory holds `dataset_dict.json` (`{"splits": [...]}`) and a `Dataset`
//! directory per split. Each dealt split's `state.json` is rewritten to the view's arrow files
//! of that split; a split chosen as always ([`crate::Options::always_splits`]) is in every view
//! whole, its `state.json` unchanged.
//!
//! The rewritten `state.json` differs from the source's in `_data_files` (the view's entries,
//! each as in the source, in the source's order) and `_fingerprint`
//! ([`crate::view_fingerprint`] of the source's fingerprint and the split's view); every other
//! field is carried unchanged.

use crate::{beside, is_inside, to_bytes, view_fingerprint, Shard};
use serde_json::Value;
use std::collections::BTreeSet;

/// A `Dataset` directory's state file.
pub const STATE: &str = "state.json";
/// A `Dataset` directory's info file.
pub const INFO: &str = "dataset_info.json";
/// A `DatasetDict` directory's list of splits.
pub const DICT: &str = "dataset_dict.json";

/// What is wrong with a `datasets` directory or its view.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field missing or of the wrong kind.
    #[error("{file}: {what}")]
    Field { file: String, what: String },
    /// A file the format needs that is not in the listing.
    #[error("{file}: needs '{missing}', which is not in the listing")]
    MissingFile { file: String, missing: String },
    /// An arrow file named in `_data_files` that is not in the listing.
    #[error("{file}: names the arrow file '{shard}', which is not in the listing")]
    MissingShard { file: String, shard: String },
    /// A name in `_data_files` that leaves the directory or is not a plain relative path.
    #[error("{file}: names '{name}', which is not a plain relative path inside the dataset")]
    BadName { file: String, name: String },
    /// An arrow file named twice.
    #[error("{file}: names the arrow file '{shard}' twice")]
    Repeated { file: String, shard: String },
    /// A split chosen as always that the `DatasetDict` does not have.
    #[error("{file}: has no split '{split}' (its splits: {splits})")]
    UnknownSplit {
        file: String,
        split: String,
        splits: String,
    },
    /// A view that holds no arrow file of a dealt split.
    #[error("{file}: the view holds none of this split's arrow files (every dealt split needs one; or show the split whole in every view as an always split)")]
    EmptySplit { file: String },
}

/// One parsed `state.json`.
#[derive(Clone, Debug)]
pub struct State {
    path: String,
    value: Value,
    fingerprint: String,
    /// The `_data_files` entries, as in the source.
    entries: Vec<Value>,
    shards: Vec<Shard>,
}

fn field(file: &str, what: impl Into<String>) -> Error {
    Error::Field {
        file: file.into(),
        what: what.into(),
    }
}

impl State {
    /// Parses the state file at `path` (`state.json` or `SPLIT/state.json`); its arrow files
    /// must be in `files`.
    pub fn parse(path: &str, value: Value, files: &BTreeSet<&str>) -> Result<State, Error> {
        let obj = value
            .as_object()
            .ok_or_else(|| field(path, "is not a JSON object"))?;
        let fingerprint = obj
            .get("_fingerprint")
            .and_then(Value::as_str)
            .ok_or_else(|| field(path, "has no `_fingerprint` string"))?
            .to_string();
        let entries = obj
            .get("_data_files")
            .and_then(Value::as_array)
            .ok_or_else(|| field(path, "has no `_data_files` list"))?
            .clone();
        let mut shards = Vec::with_capacity(entries.len());
        let mut seen = BTreeSet::new();
        for (i, e) in entries.iter().enumerate() {
            let name = e.get("filename").and_then(Value::as_str).ok_or_else(|| {
                field(path, format!("`_data_files[{i}]` has no `filename` string"))
            })?;
            if !is_inside(name) {
                return Err(Error::BadName {
                    file: path.into(),
                    name: name.into(),
                });
            }
            let shard = beside(path, name);
            if !files.contains(shard.as_str()) {
                return Err(Error::MissingShard {
                    file: path.into(),
                    shard,
                });
            }
            if !seen.insert(shard.clone()) {
                return Err(Error::Repeated {
                    file: path.into(),
                    shard,
                });
            }
            shards.push(Shard {
                name: shard.clone(),
                files: vec![shard],
            });
        }
        if shards.is_empty() {
            return Err(field(path, "`_data_files` is empty"));
        }
        Ok(State {
            path: path.into(),
            value,
            fingerprint,
            entries,
            shards,
        })
    }

    /// The state file's name.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The arrow files, as shards, in `_data_files`' order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The source's `_fingerprint`.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The state file of a view that keeps the arrow files at positions `keep` (ascending) in
    /// [`State::shards`].
    pub fn rewrite(&self, keep: &[usize]) -> Result<Vec<u8>, Error> {
        if keep.is_empty() {
            return Err(Error::EmptySplit {
                file: self.path.clone(),
            });
        }
        let mut value = self.value.clone();
        let obj = value.as_object_mut().expect("parse checked an object");
        let names: Vec<&str> = keep.iter().map(|&i| self.shards[i].name.as_str()).collect();
        obj.insert(
            "_data_files".into(),
            Value::Array(keep.iter().map(|&i| self.entries[i].clone()).collect()),
        );
        obj.insert(
            "_fingerprint".into(),
            Value::String(view_fingerprint(&self.fingerprint, &names)),
        );
        // `save_to_disk` writes state.json indented by 2, as this does.
        Ok(to_bytes(&value, true))
    }
}

/// The `dataset_info.json` beside a state file, which must be in the listing.
pub fn info_of(state: &State, files: &BTreeSet<&str>) -> Result<String, Error> {
    let info = beside(state.path(), INFO);
    if files.contains(info.as_str()) {
        Ok(info)
    } else {
        Err(Error::MissingFile {
            file: state.path().into(),
            missing: info,
        })
    }
}

/// The splits a `dataset_dict.json` lists.
pub fn splits(path: &str, value: &Value) -> Result<Vec<String>, Error> {
    let list = value
        .get("splits")
        .and_then(Value::as_array)
        .ok_or_else(|| field(path, "has no `splits` list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let s = s
            .as_str()
            .ok_or_else(|| field(path, format!("`splits[{i}]` is not a string")))?;
        if !is_inside(s) || s.contains('/') {
            return Err(Error::BadName {
                file: path.into(),
                name: s.into(),
            });
        }
        out.push(s.to_string());
    }
    if out.is_empty() {
        return Err(field(path, "`splits` is empty"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn files() -> BTreeSet<&'static str> {
        ["a.arrow", "b.arrow", "c.arrow"].into_iter().collect()
    }

    fn state(names: &[&str]) -> Value {
        json!({
            "_data_files": names.iter().map(|n| json!({"filename": n})).collect::<Vec<_>>(),
            "_fingerprint": "0123456789abcdef",
            "_format_columns": null,
            "_format_kwargs": {},
            "_format_type": null,
            "_output_all_columns": false,
            "_split": "train",
        })
    }

    #[test]
    fn a_view_keeps_its_entries_and_every_other_field() {
        let s = State::parse(STATE, state(&["a.arrow", "b.arrow", "c.arrow"]), &files()).unwrap();
        let out: Value = serde_json::from_slice(&s.rewrite(&[0, 2]).unwrap()).unwrap();
        assert_eq!(
            out["_data_files"],
            json!([{"filename": "a.arrow"}, {"filename": "c.arrow"}])
        );
        assert_eq!(out["_split"], "train");
        assert_eq!(out["_output_all_columns"], false);
        let fp = out["_fingerprint"].as_str().unwrap();
        assert_eq!(
            fp,
            view_fingerprint("0123456789abcdef", &["a.arrow", "c.arrow"])
        );
        assert_ne!(fp, "0123456789abcdef");
        assert_eq!(fp.len(), 16);
    }

    #[test]
    fn fingerprints_differ_between_views_and_repeat_for_one() {
        let s = State::parse(STATE, state(&["a.arrow", "b.arrow", "c.arrow"]), &files()).unwrap();
        let fp = |keep: &[usize]| {
            let v: Value = serde_json::from_slice(&s.rewrite(keep).unwrap()).unwrap();
            v["_fingerprint"].as_str().unwrap().to_string()
        };
        assert_eq!(fp(&[0, 1]), fp(&[0, 1]));
        assert_ne!(fp(&[0, 1]), fp(&[0, 2]));
        assert_ne!(fp(&[0, 1, 2]), "0123456789abcdef");
    }

    #[test]
    fn bad_state_files_are_named() {
        let missing = State::parse("t/state.json", state(&["z.arrow"]), &files()).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "t/state.json: names the arrow file 't/z.arrow', which is not in the listing"
        );
        let out = State::parse(STATE, state(&["../x.arrow"]), &files()).unwrap_err();
        assert!(matches!(out, Error::BadName { .. }), "{out}");
        let twice = State::parse(STATE, state(&["a.arrow", "a.arrow"]), &files()).unwrap_err();
        assert!(matches!(twice, Error::Repeated { .. }), "{twice}");
        let no_fp = State::parse(STATE, json!({"_data_files": []}), &files()).unwrap_err();
        assert_eq!(
            no_fp.to_string(),
            "state.json: has no `_fingerprint` string"
        );
        let empty = State::parse(STATE, state(&[]), &files()).unwrap_err();
        assert_eq!(empty.to_string(), "state.json: `_data_files` is empty");
        let s = State::parse(STATE, state(&["a.arrow"]), &files()).unwrap();
        assert!(matches!(s.rewrite(&[]), Err(Error::EmptySplit { .. })));
    }

    #[test]
    fn splits_are_plain_names() {
        assert_eq!(
            splits(DICT, &json!({"splits": ["train", "test"]})).unwrap(),
            ["train", "test"]
        );
        assert!(matches!(
            splits(DICT, &json!({"splits": ["../x"]})),
            Err(Error::BadName { .. })
        ));
        assert!(matches!(
            splits(DICT, &json!({"splits": "train"})),
            Err(Error::Field { .. })
        ));
    }
}
