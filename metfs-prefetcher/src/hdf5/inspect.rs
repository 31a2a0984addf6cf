//! Inspection of container files: which datasets are rows, side datasets, what is left out.

use std::path::Path;

use hdf5_sys::h5d::H5D_layout_t;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;

use super::containers::{mtime_ns, ContainerFile, Containers, DatasetInfo};
use super::ffi::attrs::attr_names;
use super::ffi::io::vlen_payload;
use super::ffi::space::{select_hyperslab, space_dims};
use super::ffi::types::{describe_type, type_size, type_traits};
use super::ffi::{
    chunk_dims, dataset_create_plist, dataset_space, dataset_storage_size, dataset_type, filters,
    high_level_file, layout, open_dataset, open_file, Cx,
};
use super::labels::read_label_dataset;
use super::{Hdf5Error, Result, INDEX_DATASET, SIDE_LIMIT};

/// Inspects the container files `files` (paths relative to `root`, a POSIX source) and checks
/// that they can be staged; see the module docs for how row datasets are chosen. `datasets`
/// names the row datasets (the same in every file); `label_dataset` names a 1-D dataset of
/// length `N` holding each row's class label.
///
/// Every bad input is reported here, before anything is staged, naming the file and dataset:
/// not an HDF5 file, a named dataset missing, datasets of different first dimensions, a dataset
/// that cannot be copied, a label dataset missing or not 1-D of length `N`.
pub fn open_containers(
    root: &Path,
    files: &[String],
    datasets: Option<&[String]>,
    label_dataset: Option<&str>,
) -> Result<Containers> {
    let mut sorted: Vec<&String> = files.iter().collect();
    // Catalog order of `<path>/<row>` names is the order of `<path>/`.
    sorted.sort_by(|a, b| {
        a.bytes()
            .chain(std::iter::once(b'/'))
            .cmp(b.bytes().chain(std::iter::once(b'/')))
    });
    for w in sorted.windows(2) {
        if w[0] == w[1] {
            return Err(Hdf5Error::BadPath {
                file: w[0].clone(),
                reason: "listed twice".into(),
            });
        }
    }
    let names: Option<Vec<String>> =
        datasets.map(|d| d.iter().map(|s| s.trim_matches('/').to_string()).collect());
    let label = label_dataset.map(|s| s.trim_matches('/').to_string());
    let mut label_ids = std::collections::HashMap::new();
    let mut label_names = Vec::new();
    let mut out = Vec::with_capacity(sorted.len());
    let mut first = vec![0u64];
    for rel in sorted {
        metfs_tier::catalog::validate_rel_path(rel).map_err(|reason| Hdf5Error::BadPath {
            file: rel.clone(),
            reason: reason.into(),
        })?;
        let cf = inspect(
            root,
            rel,
            names.as_deref(),
            label.as_deref(),
            &mut label_ids,
            &mut label_names,
        )?;
        first.push(first.last().unwrap() + cf.rows);
        out.push(cf);
    }
    if *first.last().unwrap() > u32::MAX as u64 {
        return Err(Hdf5Error::BadRows {
            file: root.display().to_string(),
            reason: format!(
                "{} rows in all is more than a catalog can hold",
                first.last().unwrap()
            ),
        });
    }
    Ok(Containers {
        root: root.to_path_buf(),
        files: out,
        first,
        label_names,
    })
}

/// Objects of one file found by walking its groups.
#[derive(Default)]
pub(super) struct Tree {
    groups: Vec<String>,
    datasets: Vec<String>,
    skipped: Vec<String>,
}

pub(super) fn walk(
    g: &::hdf5::Group,
    prefix: &str,
    tree: &mut Tree,
    seen: &mut Vec<::hdf5::LocationToken>,
) -> ::hdf5::Result<()> {
    let mut links = Vec::new();
    g.iter_visit_default(|name, info| {
        links.push((name.to_string(), info.link_type));
        Ok(())
    })?;
    for (name, kind) in links {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if kind != ::hdf5::LinkType::Hard {
            tree.skipped.push(format!("{path} (soft or external link)"));
            continue;
        }
        let info = g.loc_info_by_name(&name)?;
        // A second hard link to an object already seen (or to an ancestor: a cycle).
        if seen.contains(&info.token) {
            tree.skipped
                .push(format!("{path} (another link to an object seen)"));
            continue;
        }
        seen.push(info.token);
        match info.loc_type {
            ::hdf5::LocationType::Group => {
                tree.groups.push(path.clone());
                walk(&g.group(&name)?, &path, tree, seen)?;
            }
            ::hdf5::LocationType::Dataset => tree.datasets.push(path),
            _ => tree.skipped.push(format!("{path} (committed datatype)")),
        }
    }
    Ok(())
}

/// What [`inspect`] learns of one dataset before choosing.
pub(super) struct Probe {
    name: String,
    dims: Option<Vec<u64>>,
}

pub(super) fn inspect(
    root: &Path,
    rel: &str,
    names: Option<&[String]>,
    label: Option<&str>,
    label_ids: &mut std::collections::HashMap<String, u32>,
    label_names: &mut Vec<String>,
) -> Result<ContainerFile> {
    let cx = Cx { file: rel };
    let path = root.join(rel);
    let md = std::fs::metadata(&path).map_err(|source| Hdf5Error::Io {
        file: rel.to_string(),
        source,
    })?;
    let file = open_file(cx, &path)?;
    // The hdf5 crate walks groups portably across library versions.
    let hfile = high_level_file(cx, &file)?;
    let mut tree = Tree::default();
    let mut seen = Vec::new();
    if let Ok(info) = hfile.loc_info() {
        seen.push(info.token);
    }
    walk(&hfile, "", &mut tree, &mut seen).map_err(|e| cx.lib("list objects", e.to_string()))?;
    drop(hfile);
    if tree.datasets.iter().any(|d| d == INDEX_DATASET) {
        return Err(Hdf5Error::Unsupported {
            file: rel.to_string(),
            dataset: INDEX_DATASET.into(),
            reason: "the name is reserved for the row index staged files get".into(),
        });
    }

    let probe = |name: &str| -> Result<Probe> {
        let d = open_dataset(cx, file.0, name, H5P_DEFAULT)?;
        let s = dataset_space(cx, d.0)?;
        Ok(Probe {
            name: name.to_string(),
            dims: space_dims(cx, s.0)?,
        })
    };
    let probes: Vec<Probe> = tree
        .datasets
        .iter()
        .map(|n| probe(n))
        .collect::<Result<_>>()?;

    // The label dataset, when given, fixes N.
    let label_n = label_rows(rel, label, &probes)?;
    let (chosen, n) = row_datasets(rel, names, label, label_n, &probes, &tree.groups)?;

    let mut infos = Vec::with_capacity(chosen.len());
    for name in &chosen {
        infos.push(dataset_info(cx, file.0, name, n)?);
    }
    let row_bytes = infos.iter().map(|d| d.row_bytes).sum();

    // Side datasets and what is left out.
    let (side, side_bytes, left_out) =
        side_datasets(cx, file.0, &probes, &chosen, n, tree.skipped)?;

    let labels = match label {
        None => None,
        Some(l) => Some(read_label_dataset(
            cx,
            file.0,
            l,
            n,
            label_ids,
            label_names,
        )?),
    };

    Ok(ContainerFile {
        path: rel.to_string(),
        rows: n,
        datasets: infos,
        row_bytes,
        groups: tree.groups,
        side,
        side_bytes,
        left_out,
        width: digits(n.saturating_sub(1)),
        labels,
        len: md.len(),
        mtime_ns: mtime_ns(&md),
        source_meta: metfs_tier::catalog::Meta::from_metadata(&md),
    })
}

/// A probed dataset's first dimension: its rows, if it has any.
fn first_dim(p: &Probe) -> Option<u64> {
    p.dims.as_ref().and_then(|d| d.first().copied())
}

/// Rows the label dataset `label` gives (it must be 1-D), when one is named.
fn label_rows(rel: &str, label: Option<&str>, probes: &[Probe]) -> Result<Option<u64>> {
    Ok(match label {
        None => None,
        Some(l) => {
            let bad = |reason: String| Hdf5Error::LabelDataset {
                file: rel.to_string(),
                dataset: l.to_string(),
                reason,
            };
            let p = probes
                .iter()
                .find(|p| p.name == l)
                .ok_or_else(|| bad("not found".into()))?;
            match &p.dims {
                Some(d) if d.len() == 1 => Some(d[0]),
                Some(d) => return Err(bad(format!("not 1-D (shape {d:?})"))),
                None => return Err(bad("empty (null dataspace)".into())),
            }
        }
    })
}

/// The row datasets and their row count N: the `names` given, all with the same first
/// dimension (the label's, when there is one); without names, every dataset whose first
/// dimension is N, N being the label's or else the most common first dimension (the larger
/// on a tie).
fn row_datasets(
    rel: &str,
    names: Option<&[String]>,
    label: Option<&str>,
    label_n: Option<u64>,
    probes: &[Probe],
    groups: &[String],
) -> Result<(Vec<String>, u64)> {
    Ok(match names {
        Some(names) => {
            if names.is_empty() {
                return Err(Hdf5Error::NoDatasets {
                    file: rel.to_string(),
                    reason: "the list of datasets is empty".into(),
                });
            }
            let mut dims = Vec::new();
            for name in names {
                let missing = |reason: &str| Hdf5Error::MissingDataset {
                    file: rel.to_string(),
                    dataset: name.clone(),
                    reason: reason.to_string(),
                };
                let Some(p) = probes.iter().find(|p| &p.name == name) else {
                    let what = if groups.contains(name) {
                        "is a group, not a dataset"
                    } else {
                        "not found"
                    };
                    return Err(missing(what));
                };
                match first_dim(p) {
                    Some(d) => dims.push((name.clone(), d)),
                    None => return Err(missing("is a scalar or empty: it has no rows")),
                }
            }
            let n = dims[0].1;
            if dims.iter().any(|(_, d)| *d != n) {
                let s: Vec<String> = dims.iter().map(|(k, d)| format!("{k}: {d}")).collect();
                return Err(Hdf5Error::FirstDimMismatch {
                    file: rel.to_string(),
                    dims: s.join(", "),
                });
            }
            if let (Some(l), Some(ln)) = (label, label_n) {
                if ln != n {
                    return Err(Hdf5Error::LabelDataset {
                        file: rel.to_string(),
                        dataset: l.to_string(),
                        reason: format!("has {ln} entries, but the row datasets have {n} rows"),
                    });
                }
            }
            (names.to_vec(), n)
        }
        None => {
            let n = match label_n {
                Some(n) => n,
                None => {
                    let mut counts: Vec<(u64, usize)> = Vec::new();
                    for d in probes.iter().filter_map(first_dim) {
                        match counts.iter_mut().find(|(k, _)| *k == d) {
                            Some((_, c)) => *c += 1,
                            None => counts.push((d, 1)),
                        }
                    }
                    counts
                        .iter()
                        .max_by_key(|(d, c)| (*c, *d))
                        .map(|(d, _)| *d)
                        .ok_or_else(|| Hdf5Error::NoDatasets {
                            file: rel.to_string(),
                            reason: "no dataset has rank 1 or more".into(),
                        })?
                }
            };
            let chosen: Vec<String> = probes
                .iter()
                .filter(|p| first_dim(p) == Some(n))
                .map(|p| p.name.clone())
                .collect();
            (chosen, n)
        }
    })
}

/// The datasets copied whole into every staged file (side datasets: small, of a supported
/// type, not rows), their bytes, and what is left out and why (`skipped` by the walk first).
fn side_datasets(
    cx: Cx,
    file: hid_t,
    probes: &[Probe],
    chosen: &[String],
    n: u64,
    skipped: Vec<String>,
) -> Result<(Vec<String>, u64, Vec<String>)> {
    let mut side = Vec::new();
    let mut side_bytes = 0;
    let mut left_out = skipped;
    for p in probes {
        if chosen.contains(&p.name) {
            continue;
        }
        if first_dim(p) == Some(n) {
            left_out.push(format!("{} (has {n} rows but was not named)", p.name));
            continue;
        }
        let d = open_dataset(cx, file, &p.name, H5P_DEFAULT)?;
        let t = dataset_type(cx, d.0)?;
        let bytes = dataset_storage_size(d.0);
        if let (Some(why), _) = type_traits(t.0) {
            left_out.push(format!("{} ({why})", p.name));
        } else if bytes > SIDE_LIMIT {
            left_out.push(format!(
                "{} ({bytes} bytes, more than the {SIDE_LIMIT} copied into every staged file)",
                p.name
            ));
        } else {
            side.push(p.name.clone());
            side_bytes += bytes;
        }
    }
    Ok((side, side_bytes, left_out))
}

/// Inspects one row dataset (`n` rows) and checks it can be staged.
pub(super) fn dataset_info(cx: Cx, file: hid_t, name: &str, n: u64) -> Result<DatasetInfo> {
    let unsupported = |reason: String| Hdf5Error::Unsupported {
        file: cx.file.to_string(),
        dataset: name.to_string(),
        reason,
    };
    let d = open_dataset(cx, file, name, H5P_DEFAULT)?;
    let s = dataset_space(cx, d.0)?;
    let t = dataset_type(cx, d.0)?;
    let dcpl = dataset_create_plist(cx, d.0)?;
    let dims = space_dims(cx, s.0)?.unwrap_or_default();
    let (problem, vlen) = type_traits(t.0);
    if let Some(p) = problem {
        return Err(unsupported(p.to_string()));
    }
    let elem_size = type_size(t.0) as u64;
    let chunk = if layout(dcpl.0) == H5D_layout_t::H5D_CHUNKED {
        Some(chunk_dims(cx, dcpl.0, dims.len())?)
    } else {
        None
    };
    let mut fl = Vec::new();
    let mut dropped = Vec::new();
    for (id, desc, dec, enc) in filters(cx, dcpl.0)? {
        if !dec {
            return Err(unsupported(format!(
                "it is compressed with {desc}, which this HDF5 library cannot decode \
                 (filter id {id}; h5py's lzf and Blosc need plugins)"
            )));
        }
        if !enc {
            dropped.push(desc.clone());
        }
        fl.push(desc);
    }
    let trailing = dims[1..].to_vec();
    let elems: u64 = trailing.iter().product();
    let row_bytes = if vlen && n > 0 {
        // The handles plus the payload of a sample of rows, averaged.
        let sample = n.min(VLEN_SAMPLE_ROWS);
        let mut count = dims.clone();
        count[0] = sample;
        select_hyperslab(
            cx,
            || "select rows".into(),
            s.0,
            &vec![0; dims.len()],
            &count,
            None,
        )?;
        let payload = vlen_payload(cx, name, d.0, t.0, s.0)?;
        elems * elem_size + payload.div_ceil(sample)
    } else {
        elems * elem_size
    };
    Ok(DatasetInfo {
        name: name.to_string(),
        dtype: describe_type(t.0),
        elem_size,
        trailing,
        chunk,
        filters: fl,
        dropped_filters: dropped,
        attrs: attr_names(cx, d.0)?,
        row_bytes,
        vlen,
    })
}

/// Digits of the last row number `n`: the width rows are zero-padded to in sample names.
pub(super) fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Rows sampled to estimate the bytes per row of a variable-length dataset.
const VLEN_SAMPLE_ROWS: u64 = 1024;
