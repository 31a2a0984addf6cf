//! [`Containers`]: inspected container files, and the arithmetic between rows and sample ids.

use std::path::{Path, PathBuf};

use super::{Hdf5Error, Result};
use metfs_tier::catalog::{BuildError, Catalog, CatalogBuilder};

// ---------------------------------------------------------------------------------------------
// Container inspection.

/// One row dataset of a container file, as inspected by [`open_containers`](super::open_containers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetInfo {
    /// Path inside the file, without a leading `/` (`images`, `group/x`).
    pub name: String,
    /// numpy-like type name (`float32`, `int64`, `|S16`, `vlen str`, `compound(24 bytes)`).
    pub dtype: String,
    /// Bytes of one element in the file's type (for variable-length types, of its handle).
    pub elem_size: u64,
    /// Shape after axis 0.
    pub trailing: Vec<u64>,
    /// Chunk shape, when the dataset is chunked.
    pub chunk: Option<Vec<u64>>,
    /// Filters of the source, in pipeline order (`shuffle`, `gzip(4)`, …).
    pub filters: Vec<String>,
    /// Source filters the library cannot encode, so staged copies go without them.
    pub dropped_filters: Vec<String>,
    /// Names of the dataset's attributes.
    pub attrs: Vec<String>,
    /// Bytes of one row (estimated from sampled rows for variable-length types).
    pub row_bytes: u64,
    /// True when the type holds variable-length data.
    pub vlen: bool,
}

/// One container file, as inspected by [`open_containers`](super::open_containers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFile {
    /// Path relative to the source root; also the catalog directory of its rows.
    pub path: String,
    /// Number of rows `N`.
    pub rows: u64,
    /// The row datasets, in file order (by name within each group, groups depth first).
    pub datasets: Vec<DatasetInfo>,
    /// Bytes of one row across the row datasets (what a sample weighs, less `metfs_index`).
    pub row_bytes: u64,
    /// Groups recreated in staged files (parents before children).
    pub groups: Vec<String>,
    /// Datasets copied whole into each staged file, and their total bytes.
    pub side: Vec<String>,
    /// Bytes of the side datasets (storage size in the source), per staged file.
    pub side_bytes: u64,
    /// Objects that staged files do not hold, each with why.
    pub left_out: Vec<String>,
    /// Digits of the row part of sample names.
    pub(super) width: usize,
    /// Class id of each row (into [`Containers::label_names`]) when there is a label dataset.
    pub(super) labels: Option<Vec<u32>>,
    /// Size and modification time when inspected, to notice a source that changes.
    pub(super) len: u64,
    pub(super) mtime_ns: i128,
    /// The source file's permission bits, owner and group when inspected: a staged container
    /// is the daemon's own file, but the mount shows it as the source does (without write
    /// bits), so that `--allow-other` lets in exactly the users the source lets in.
    pub source_meta: metfs_tier::catalog::Meta,
}

/// Container files of a dataset, inspected and validated. Plain data (no open HDF5 handles):
/// share it between threads freely.
#[derive(Debug, Clone)]
pub struct Containers {
    pub(super) root: PathBuf,
    pub(super) files: Vec<ContainerFile>,
    /// `first[i]` is the sample id of row 0 of file `i`; `first[files.len()]` is the total.
    pub(super) first: Vec<u64>,
    pub(super) label_names: Vec<String>,
}

pub(super) fn mtime_ns(md: &std::fs::Metadata) -> i128 {
    md.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128)
}

impl Containers {
    /// The source root the container paths are relative to.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Total rows over all files: the number of samples.
    pub fn samples(&self) -> usize {
        *self.first.last().unwrap() as usize
    }

    /// The files, in sample-id order (see the module docs).
    pub fn files(&self) -> &[ContainerFile] {
        &self.files
    }

    /// Index of the file with relative path `path`.
    pub fn file_index(&self, path: &str) -> Option<usize> {
        self.files.iter().position(|f| f.path == path)
    }

    /// Names of the labels, indexed by the class ids the files' rows carry, when there is a
    /// label dataset.
    pub fn label_names(&self) -> &[String] {
        &self.label_names
    }

    /// Label of row `row` of file `file`, when there is a label dataset.
    pub fn label(&self, file: usize, row: u64) -> Option<&str> {
        let l = self.files[file].labels.as_ref()?;
        Some(&self.label_names[l[row as usize] as usize])
    }

    /// Catalog size of one sample of file `file`: its row bytes plus 8 for `metfs_index`.
    pub fn sample_size(&self, file: usize) -> u64 {
        self.files[file].row_bytes + 8
    }

    /// Sample id of row `row` of file `file`.
    pub fn sample_id(&self, file: usize, row: u64) -> u32 {
        debug_assert!(row < self.files[file].rows);
        (self.first[file] + row) as u32
    }

    /// File index and row of sample `sample` (binary search over the files: O(log files)).
    pub fn locate(&self, sample: u32) -> (usize, u64) {
        let s = sample as u64;
        let f = self.first.partition_point(|&x| x <= s) - 1;
        (f, s - self.first[f])
    }

    /// Catalog path of sample `sample`: `<file>/<row>`, the row zero-padded.
    pub fn sample_path(&self, sample: u32) -> String {
        let (f, row) = self.locate(sample);
        let cf = &self.files[f];
        format!("{}/{:0w$}", cf.path, row, w = cf.width)
    }

    /// Groups a mini-epoch's sample ids by file: `(file index, ascending rows)` for every file
    /// with at least one row in it, in file order. This is what [`stage_rows`](super::stage_rows) takes.
    pub fn rows_by_file(&self, samples: &[u32]) -> Vec<(usize, Vec<u64>)> {
        let mut per: Vec<Vec<u64>> = vec![Vec::new(); self.files.len()];
        for &s in samples {
            let (f, r) = self.locate(s);
            per[f].push(r);
        }
        per.into_iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(f, mut r)| {
                r.sort_unstable();
                r.dedup();
                (f, r)
            })
            .collect()
    }

    /// Builds the catalog: one sample per row, named `<file>/<row>`, sized
    /// [`Containers::sample_size`], labelled from the label dataset when there is one, with an
    /// empty version (a container's identity is checked per file by [`stage_rows`](super::stage_rows)). Sample
    /// ids equal [`Containers::sample_id`]. `origin` names the source in errors.
    pub fn catalog(&self, origin: &str) -> Result<Catalog> {
        let mut b = CatalogBuilder::with_capacity(self.samples());
        let mut path = String::new();
        for (fi, cf) in self.files.iter().enumerate() {
            let size = self.sample_size(fi);
            for row in 0..cf.rows {
                use std::fmt::Write;
                path.clear();
                let _ = write!(path, "{}/{:0w$}", cf.path, row, w = cf.width);
                let label = cf
                    .labels
                    .as_ref()
                    .map(|l| self.label_names[l[row as usize] as usize].as_str());
                b.push(&path, size, "", label, None)
                    .map_err(|e| catalog_err(origin, e))?;
            }
        }
        let cat = b.finish(origin).map_err(|e| catalog_err(origin, e))?;
        // The arithmetic of `sample_id` holds only if the catalog kept the files' order.
        for (fi, cf) in self.files.iter().enumerate() {
            if cf.rows > 0
                && cat.path(self.first[fi] as u32) != self.sample_path(self.first[fi] as u32)
            {
                return Err(Hdf5Error::BadPath {
                    file: cf.path.clone(),
                    reason: format!("{origin}: catalog order differs from container order"),
                });
            }
        }
        Ok(cat)
    }

    /// Checks that file `file` still has the size and modification time it had when inspected.
    pub fn check_unchanged(&self, file: usize) -> Result<()> {
        let cf = &self.files[file];
        let md = std::fs::metadata(self.root.join(&cf.path)).map_err(|source| Hdf5Error::Io {
            file: cf.path.clone(),
            source,
        })?;
        if md.len() != cf.len || mtime_ns(&md) != cf.mtime_ns {
            return Err(Hdf5Error::SourceChanged {
                file: cf.path.clone(),
                reason: format!(
                    "size {} -> {}, mtime {} -> {}",
                    cf.len,
                    md.len(),
                    cf.mtime_ns,
                    mtime_ns(&md)
                ),
            });
        }
        Ok(())
    }
}

pub(super) fn catalog_err(origin: &str, e: BuildError) -> Hdf5Error {
    Hdf5Error::BadPath {
        file: origin.to_string(),
        reason: format!("{e:?}"),
    }
}
