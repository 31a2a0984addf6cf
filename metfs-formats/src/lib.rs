//! Format views: the sharded formats users store, read by their own loaders from a view that
//! holds one mini-epoch.
//!
//! A sharded dataset is a directory of *shards* (the files that hold the samples) and, for most
//! formats, an *index* file that names every shard. Dealing the shards to mini-epochs is the
//! planner's job; this crate says which files are which and rewrites the index so that it
//! names exactly the shards a view holds. The format's own loader (`datasets.load_from_disk`,
//! `streaming.StreamingDataset`, `litdata.StreamingDataset`, `webdataset.WebDataset`) then
//! reads the view unmodified.
//!
//! The crate is pure: bytes in, bytes out. It reads no file and spawns nothing; the caller lists
//! the source, reads the files [`wanted`] names, and writes what [`Layout::view`] returns.
//!
//! # Use
//!
//! 1. [`wanted`]`(files)`: the candidate index files in a listing, to be read by the caller.
//! 2. [`detect`]`(files, indexes, options)` (or [`layout`] with a [`Format`] chosen by a
//!    setting): the [`Layout`], each file of the listing classified as
//!    * an *index* file ([`Layout::index_files`]): rewritten for every view;
//!    * an *always* file ([`Layout::always`]): in every view, unchanged, never dealt;
//!    * a member of a *shard* ([`Layout::shards`]): dealt to mini-epochs. A [`Shard`] is a
//!      sample group: a shard's files (an MDS shard's raw and compressed forms, a `.tar` and its
//!      `.idx`) enter and leave a view together;
//!    * *other* ([`Layout::other`]): not part of the format (a README, `.DS_Store`, a cache
//!      file): left to the caller's settings.
//! 3. [`Layout::view`]`(shards)`: the view's files and its rewritten index files.
//!
//! File names are relative to the dataset's root, `/`-separated, as the catalog keeps them. A
//! dataset is detected at the root of the listing only.
//!
//! # Formats
//!
//! | format | detected by | index (rewritten) | always | shard |
//! |---|---|---|---|---|
//! | Hugging Face `datasets`, a `Dataset` | `state.json` and `dataset_info.json` at the root | `state.json` | `dataset_info.json` | an arrow file named in `_data_files` |
//! | Hugging Face `datasets`, a `DatasetDict` | `dataset_dict.json` at the root | each dealt split's `state.json` | `dataset_dict.json`, each split's `dataset_info.json`, every file of an always split | a dealt split's arrow file (`train/data-00000-of-00008.arrow`) |
//! | MosaicML MDS | `index.json` with `shards` | `index.json` | none | a `shards` entry: its `raw_data` and `zip_data` files present |
//! | litdata | `index.json` with `chunks` and `config` | `index.json` | none | a `chunks` entry's file |
//! | WebDataset | `.tar`, `.tar.gz`, `.tgz` files, no index | none | none | a tar and its index file ([`group`]) |
//! | TFRecord | `.tfrecord`, `.tfrecords`, `.tfrec`, `.tfrecord.gz` files, no index | none | none | a record file and its index file ([`group`]) |
//!
//! Not supported: an MDS dataset of several streams or splits (`local/split/index.json`); a
//! litdata or MDS index below the root; TensorFlow's suffix-less shard names
//! (`train.tfrecord-00000-of-01024`, choose [`Format::TfRecord`] by a setting and group by name
//! later); Hugging Face `datasets` caches (`cache-*.arrow`, which are *other* files).
//!
//! # Invariants
//!
//! * A rewritten index names exactly the view's shards, in the source index's order (not the
//!   order the view listed them in), so a view's index is a function of its shard *set*: the
//!   same set gives the same bytes on every node and at every generation. Every other field is
//!   carried unchanged (JSON objects are written with sorted keys), except:
//!   * Hugging Face `state.json`: `_data_files` (the view's entries, each entry as in the
//!     source) and `_fingerprint`, derived from the source's fingerprint and the split's shard
//!     set ([`view_fingerprint`]), so `datasets`' cache, keyed by fingerprint, never mixes two
//!     views, or a view and the whole dataset;
//!   * MDS `index.json`: `shards`;
//!   * litdata `index.json`: `chunks`, and `updated_at` (when the source has one) derived as the
//!     fingerprint is: litdata names its chunk cache directory after it, and a mount's path
//!     stays the same across views. litdata checks no per-chunk consistency and no total: it
//!     adds the kept chunks' `chunk_size` (or `dim` for its token loader) as it reads.
//! * A view holds at least one shard, and with a `DatasetDict` at least one shard of every
//!   dealt split: the loaders refuse an index of no shard.
//! * Every shard an index names is in the listing, every name the view asks for is a shard or
//!   one of its files, and every name an index gives is relative and stays inside the dataset
//!   (no `..`, no leading `/`): otherwise an [`Error`] naming the index file and the name.
//! * The layout depends only on the listing, the index bytes and the options, so every node
//!   computes the same one.

pub mod group;
pub mod hf;
pub mod litdata;
pub mod mds;
pub mod select;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// The formats this crate knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// A Hugging Face `datasets` `Dataset` saved with `save_to_disk`.
    HfDataset,
    /// A Hugging Face `datasets` `DatasetDict` saved with `save_to_disk` (a directory per split).
    HfDatasetDict,
    /// A MosaicML Streaming (MDS) directory.
    Mds,
    /// A litdata optimized directory.
    Litdata,
    /// WebDataset tar shards, each with its optional index file.
    WebDataset,
    /// TFRecord files, each with its optional index file.
    TfRecord,
}

impl Format {
    /// Every format, in the order [`detect`] tries them.
    pub const ALL: [Format; 6] = [
        Format::HfDataset,
        Format::HfDatasetDict,
        Format::Mds,
        Format::Litdata,
        Format::WebDataset,
        Format::TfRecord,
    ];

    /// The format's name in settings and messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::HfDataset => "hf-dataset",
            Format::HfDatasetDict => "hf-dataset-dict",
            Format::Mds => "mds",
            Format::Litdata => "litdata",
            Format::WebDataset => "webdataset",
            Format::TfRecord => "tfrecord",
        }
    }

    /// The format named `name` (as [`Format::name`] writes it).
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One shard: the files that are dealt, staged and shown together (a sample group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    /// The shard's name: its main file (the arrow file, the MDS raw file, the tar).
    pub name: String,
    /// Every file of the shard present in the listing, the main file first where present (an
    /// MDS shard kept only compressed has its `zip_data` file alone).
    pub files: Vec<String>,
}

/// Settings that change a layout.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Splits of a `DatasetDict` shown whole in every view (a validation or test split) rather
    /// than dealt; every other split is dealt.
    pub always_splits: Vec<String>,
}

/// What went wrong reading a dataset's index or building a view.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An index file that is not JSON.
    #[error("{file}: does not parse as JSON: {source}")]
    Parse {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    /// An index file the layout needs that the caller did not pass in.
    #[error("{file}: listed but its bytes were not passed in (read every file `wanted` names)")]
    NotRead { file: String },
    /// An `index.json` that is neither MDS nor litdata.
    #[error("{file}: neither an MDS index (a `shards` list) nor a litdata index (`chunks` and `config`)")]
    UnknownIndex { file: String },
    /// A format chosen by a setting whose index file is not in the listing.
    #[error("{file}: not in the listing, and the {format} format needs it")]
    NoIndex { file: String, format: Format },
    /// A format without an index chosen by a setting, and no file of its kind in the listing.
    #[error("no {format} shard in the listing (suffixes {suffixes})")]
    NoShards { format: Format, suffixes: String },
    /// A view asks for a name that is neither a shard nor a shard's file.
    #[error("{index}: names no shard '{shard}' (the view asks for it)")]
    UnknownShard { index: String, shard: String },
    /// A view of no shard.
    #[error("{index}: a view holds at least one shard; this one holds none")]
    EmptyView { index: String },
    #[error(transparent)]
    Hf(#[from] hf::Error),
    #[error(transparent)]
    Mds(#[from] mds::Error),
    #[error(transparent)]
    Litdata(#[from] litdata::Error),
}

/// One index file of a layout, parsed.
#[derive(Clone, Debug)]
enum Index {
    Hf(hf::State),
    Mds(mds::Index),
    Litdata(litdata::Index),
}

impl Index {
    fn path(&self) -> &str {
        match self {
            Index::Hf(x) => x.path(),
            Index::Mds(x) => x.path(),
            Index::Litdata(x) => x.path(),
        }
    }

    fn shards(&self) -> &[Shard] {
        match self {
            Index::Hf(x) => x.shards(),
            Index::Mds(x) => x.shards(),
            Index::Litdata(x) => x.shards(),
        }
    }

    fn rewrite(&self, keep: &[usize]) -> Result<Vec<u8>, Error> {
        Ok(match self {
            Index::Hf(x) => x.rewrite(keep)?,
            Index::Mds(x) => x.rewrite(keep)?,
            Index::Litdata(x) => x.rewrite(keep)?,
        })
    }
}

/// A dataset's files classified (see the crate docs), with its parsed index files.
#[derive(Clone, Debug)]
pub struct Layout {
    format: Format,
    /// The file that names the shards, for messages: the index, or the format's name.
    main: String,
    indexes: Vec<Index>,
    always: Vec<String>,
    shards: Vec<Shard>,
    other: Vec<String>,
    /// Every shard's name and files → the shard's position in `shards`.
    by_name: HashMap<String, usize>,
    /// Per index, the position of its first shard in `shards` (its shards are contiguous).
    first: Vec<usize>,
}

/// A view's files and its index files' bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The view's shards, as positions in [`Layout::shards`], ascending.
    pub shards: Vec<usize>,
    /// Every file the view shows as it is in the source: the always files, then the shards'
    /// files in the source's order.
    pub files: Vec<String>,
    /// The rewritten index files: (name, bytes), to be shown in place of the source's.
    pub indexes: Vec<(String, Vec<u8>)>,
}

/// The files of a listing that [`detect`] and [`layout`] may need to read: every candidate
/// index file present (`state.json`, `dataset_dict.json`, `index.json` at the root, and a
/// `DatasetDict` split's `state.json` one level down).
pub fn wanted<S: AsRef<str>>(files: &[S]) -> Vec<String> {
    files
        .iter()
        .map(AsRef::as_ref)
        .filter(|f| {
            matches!(*f, hf::STATE | hf::DICT | "index.json")
                || f.split_once('/')
                    .is_some_and(|(dir, rest)| !dir.is_empty() && rest == hf::STATE)
        })
        .map(str::to_string)
        .collect()
}

/// The format of a listing, from the names alone, without reading a file: `None` when it is
/// none of them. `index.json` is MDS or litdata; its bytes decide ([`detect`]), and this says
/// [`Format::Mds`] for both.
pub fn guess<S: AsRef<str>>(files: &[S]) -> Option<Format> {
    let set: BTreeSet<&str> = files.iter().map(AsRef::as_ref).collect();
    if set.contains(hf::STATE) && set.contains(hf::INFO) {
        Some(Format::HfDataset)
    } else if set.contains(hf::DICT) {
        Some(Format::HfDatasetDict)
    } else if set.contains("index.json") {
        Some(Format::Mds)
    } else {
        [Format::WebDataset, Format::TfRecord]
            .into_iter()
            .find(|&f| group::Rule::of(f).is_some_and(|r| group::is_grouped(r, &set)))
    }
}

/// Detects the format of a listing and classifies its files: `Ok(None)` when it is none of the
/// formats. `indexes` holds the bytes of the files [`wanted`] named (more is fine).
pub fn detect<S: AsRef<str>>(
    files: &[S],
    indexes: &BTreeMap<String, Vec<u8>>,
    options: &Options,
) -> Result<Option<Layout>, Error> {
    let Some(mut format) = guess(files) else {
        return Ok(None);
    };
    if format == Format::Mds {
        let value = parse("index.json", indexes)?;
        format = if mds::is_mds(&value) {
            Format::Mds
        } else if litdata::is_litdata(&value) {
            Format::Litdata
        } else {
            return Err(Error::UnknownIndex {
                file: "index.json".into(),
            });
        };
    }
    layout(format, files, indexes, options).map(Some)
}

/// Classifies a listing's files as `format` (chosen by a setting, or by [`detect`]).
pub fn layout<S: AsRef<str>>(
    format: Format,
    files: &[S],
    indexes: &BTreeMap<String, Vec<u8>>,
    options: &Options,
) -> Result<Layout, Error> {
    let list: BTreeSet<&str> = files.iter().map(AsRef::as_ref).collect();
    let Classified {
        main,
        parts,
        always,
        grouped,
    } = classify(format, &list, indexes, options)?;
    let mut shards = Vec::new();
    let mut first = Vec::new();
    for p in &parts {
        first.push(shards.len());
        shards.extend(p.shards().iter().cloned());
    }
    shards.extend(grouped);
    let mut by_name = HashMap::new();
    for (i, s) in shards.iter().enumerate() {
        by_name.insert(s.name.clone(), i);
        for f in &s.files {
            by_name.insert(f.clone(), i);
        }
    }
    let index_files: BTreeSet<&str> = parts.iter().map(Index::path).collect();
    let always_set: BTreeSet<&str> = always.iter().map(String::as_str).collect();
    let other = list
        .iter()
        .filter(|f| {
            !by_name.contains_key(**f) && !index_files.contains(**f) && !always_set.contains(**f)
        })
        .map(|f| f.to_string())
        .collect();
    Ok(Layout {
        format,
        main,
        indexes: parts,
        always,
        shards,
        other,
        by_name,
        first,
    })
}

/// A listing's files sorted by format: the file that names the shards (for messages), the
/// parsed indexes, the always files and the unindexed formats' groups.
struct Classified {
    main: String,
    parts: Vec<Index>,
    always: Vec<String>,
    grouped: Vec<Shard>,
}

/// [`layout`]'s first step: the format's index files parsed and its files classified.
fn classify(
    format: Format,
    list: &BTreeSet<&str>,
    indexes: &BTreeMap<String, Vec<u8>>,
    options: &Options,
) -> Result<Classified, Error> {
    let need = |file: &str| {
        if list.contains(file) {
            Ok(())
        } else {
            Err(Error::NoIndex {
                file: file.into(),
                format,
            })
        }
    };
    let mut parts = Vec::new();
    let mut always = Vec::new();
    let mut grouped = Vec::new();
    let main;
    match format {
        Format::HfDataset => {
            need(hf::STATE)?;
            main = hf::STATE.to_string();
            let state = hf::State::parse(hf::STATE, parse(hf::STATE, indexes)?, list)?;
            always.push(hf::info_of(&state, list)?);
            parts.push(Index::Hf(state));
        }
        Format::HfDatasetDict => {
            need(hf::DICT)?;
            main = hf::DICT.to_string();
            let splits = hf::splits(hf::DICT, &parse(hf::DICT, indexes)?)?;
            for s in &options.always_splits {
                if !splits.contains(s) {
                    return Err(hf::Error::UnknownSplit {
                        file: hf::DICT.into(),
                        split: s.clone(),
                        splits: splits.join(", "),
                    }
                    .into());
                }
            }
            always.push(hf::DICT.to_string());
            for split in &splits {
                let path = format!("{split}/{}", hf::STATE);
                if !list.contains(path.as_str()) {
                    return Err(hf::Error::MissingFile {
                        file: hf::DICT.into(),
                        missing: path,
                    }
                    .into());
                }
                let state = hf::State::parse(&path, parse(&path, indexes)?, list)?;
                always.push(hf::info_of(&state, list)?);
                if options.always_splits.contains(split) {
                    always.push(path);
                    always.extend(state.shards().iter().flat_map(|s| s.files.iter().cloned()));
                } else {
                    parts.push(Index::Hf(state));
                }
            }
        }
        Format::Mds | Format::Litdata => {
            need("index.json")?;
            main = "index.json".to_string();
            let value = parse("index.json", indexes)?;
            parts.push(if format == Format::Mds {
                Index::Mds(mds::Index::parse("index.json", value, list)?)
            } else {
                Index::Litdata(litdata::Index::parse("index.json", value, list)?)
            });
        }
        Format::WebDataset | Format::TfRecord => {
            let rule = group::Rule::of(format).expect("an unindexed format has a rule");
            main = format!("the {format} shards");
            grouped = group::group(rule, list);
            if grouped.is_empty() {
                return Err(Error::NoShards {
                    format,
                    suffixes: rule.shard_suffixes.join(" "),
                });
            }
        }
    }
    Ok(Classified {
        main,
        parts,
        always,
        grouped,
    })
}

impl Layout {
    /// The format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The index files rewritten for every view.
    pub fn index_files(&self) -> Vec<&str> {
        self.indexes.iter().map(Index::path).collect()
    }

    /// The files in every view, unchanged.
    pub fn always(&self) -> &[String] {
        &self.always
    }

    /// The shards, in the source index's order (unindexed formats: by name).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The listing's files that are not part of the format.
    pub fn other(&self) -> &[String] {
        &self.other
    }

    /// The position in [`Layout::shards`] of the shard named `name` or holding the file `name`.
    pub fn shard_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The view of the shards named in `names` (each a shard's name or one of its files;
    /// repeats are one): its files and its rewritten index files.
    pub fn view<S: AsRef<str>>(&self, names: &[S]) -> Result<View, Error> {
        let mut set = BTreeSet::new();
        for n in names {
            let n = n.as_ref();
            let i = self.shard_of(n).ok_or_else(|| Error::UnknownShard {
                index: self.main.clone(),
                shard: n.into(),
            })?;
            set.insert(i);
        }
        self.view_of(&set)
    }

    /// The view of the shards at positions `shards` in [`Layout::shards`].
    pub fn view_of(&self, shards: &BTreeSet<usize>) -> Result<View, Error> {
        if shards.is_empty() {
            return Err(Error::EmptyView {
                index: self.main.clone(),
            });
        }
        if let Some(&bad) = shards.iter().find(|&&i| i >= self.shards.len()) {
            return Err(Error::UnknownShard {
                index: self.main.clone(),
                shard: format!("#{bad}"),
            });
        }
        let mut indexes = Vec::new();
        for (p, &first) in self.indexes.iter().zip(&self.first) {
            let n = p.shards().len();
            let keep: Vec<usize> = shards.range(first..first + n).map(|i| i - first).collect();
            indexes.push((p.path().to_string(), p.rewrite(&keep)?));
        }
        let mut files = self.always.clone();
        files.extend(
            shards
                .iter()
                .flat_map(|&i| self.shards[i].files.iter().cloned()),
        );
        Ok(View {
            shards: shards.iter().copied().collect(),
            files,
            indexes,
        })
    }
}

/// The fingerprint of a view: FNV-1a 64 over the source's fingerprint and the view's shard
/// names (in the source's order, each after a 0 byte), as 16 hex digits (the width of the
/// fingerprints `datasets` makes). Distinct shard sets of one source give distinct
/// fingerprints, up to 64-bit hash collisions, and no view shares the source's fingerprint.
pub fn view_fingerprint<S: AsRef<str>>(source: &str, shards: &[S]) -> String {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(b"metfs-view\0");
    h.write(source.as_bytes());
    for s in shards {
        h.write(&[0]);
        h.write(s.as_ref().as_bytes());
    }
    format!("{:016x}", h.finish())
}

/// The bytes of `file` from `indexes`, parsed as JSON.
fn parse(file: &str, indexes: &BTreeMap<String, Vec<u8>>) -> Result<Value, Error> {
    let bytes = indexes
        .get(file)
        .ok_or_else(|| Error::NotRead { file: file.into() })?;
    serde_json::from_slice(bytes).map_err(|source| Error::Parse {
        file: file.into(),
        source,
    })
}

/// Whether `name`, as an index gives it, is a plain relative path inside the dataset.
pub(crate) fn is_inside(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\\')
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// `name` joined under the directory of `index` (`train/state.json` + `a.arrow` →
/// `train/a.arrow`).
pub(crate) fn beside(index: &str, name: &str) -> String {
    match index.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{name}"),
        None => name.to_string(),
    }
}

/// JSON bytes of `value`, compact, with a final newline.
pub(crate) fn to_bytes(value: &Value, pretty: bool) -> Vec<u8> {
    let mut out = if pretty {
        serde_json::to_vec_pretty(value)
    } else {
        serde_json::to_vec(value)
    }
    .expect("a JSON value serializes");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
