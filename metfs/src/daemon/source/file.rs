//! Catalog files: made once per dataset version (`metfs catalog`, [`make_catalog_file`]) and
//! mounted from by every node (`catalog = FILE`, [`load_catalog_file`]) without a listing.
//!
//! A mount from a catalog file reads the file, refuses it when it is truncated, of another
//! format or damaged (`CatalogFile::read`), when it lists another source than the mount's, or
//! when the source is stale as far as one stat or one request tells
//! (`CapacityTier::catalog_stamp_differs`: a POSIX root's mtime, an object's ETag); then it
//! plans from it. Staging checks each sample's size and version against it as against a
//! listing, so a sample changed since is reported when it is staged. Nothing of the tier is
//! listed, so a mount succeeds where the user may read files by path but not list directories.
//!
//! Making one keeps the file already at the output when it is a catalog of the same source,
//! made with the same labels, and still current (`catalog_is_current`: one stat per directory
//! for POSIX, one listing for an object store), so a job script can run it every time.

use metfs_tier::catalog::{CatalogFile, SourceStamp};

use crate::config::MountConfig;
use crate::daemon::source::{
    check_catalog_fits, label_by_hdf5, list_catalog, needs_labels, open_tier, read_manifest,
};
use crate::daemon::DaemonError;
use metfs_plan::size::format_bytes;
use metfs_tier::catalog::Catalog;
use metfs_tier::CapacityTier;
use std::path::Path;
use std::time::Instant;

/// What [`make_catalog_file`] did.
#[derive(Debug, Clone)]
pub struct MadeCatalog {
    /// The file's header (source, stamp, counts, digest).
    pub header: metfs_tier::catalog::CatalogFileHeader,
    /// The file was already a current catalog of the source and was kept.
    pub kept: bool,
    /// Why an existing file was not kept, when there was one.
    pub replaced: Option<String>,
}

/// How labels read from an HDF5 dataset or attribute `name` are described in a header.
pub(super) fn hdf5_labels_origin(name: &str) -> String {
    format!("HDF5 {name}")
}

/// Whether a mount of `tier` with `cfg` would accept catalog file `file`: the same reading and
/// checks as the mount's (format, source, staleness, fit), without a listing. Gives the number
/// of samples; `metfs doctor` asks it on every node instead of listing the tier.
pub async fn mountable_catalog_file(
    tier: &dyn CapacityTier,
    file: &Path,
    cfg: &MountConfig,
) -> Result<usize, DaemonError> {
    load_catalog_file(tier, file, cfg)
        .await
        .map(|(cat, _)| cat.len())
}

/// The catalog of catalog file `file` for a mount of `tier`, and how its labels were made.
pub(super) async fn load_catalog_file(
    tier: &dyn CapacityTier,
    file: &Path,
    cfg: &MountConfig,
) -> Result<(Catalog, Option<String>), DaemonError> {
    let t = Instant::now();
    let path = file.to_path_buf();
    let f = tokio::task::spawn_blocking(move || CatalogFile::read(&path))
        .await
        .expect("reading the catalog file panicked")?;
    f.check_source(file, tier.url())?;
    let stale = match &f.header.stamp {
        SourceStamp::Manifest { .. } => manifest_changed(&f.header.stamp),
        _ => tier.catalog_stamp_differs(&f.catalog).await?,
    };
    if let Some(what) = stale {
        return Err(metfs_tier::catalog::CatalogError::Stale {
            path: file.display().to_string(),
            mount_source: tier.url().to_string(),
            what,
        }
        .into());
    }
    let mut cat = f.catalog;
    check_catalog_fits(&cat, cfg)?;
    if cfg.label_from_dirs || (needs_labels(cfg.compose) && cat.labels().is_none()) {
        cat.label_by_first_dir();
    }
    tracing::info!(
        file = %file.display(),
        samples = cat.len(),
        bytes = %format_bytes(cat.total_bytes()),
        digest = %format!("{:08x}", f.header.versions_digest),
        made_at = f.header.made_at_secs,
        secs = t.elapsed().as_secs_f64(),
        "catalogue read from the catalog file; the source is not listed"
    );
    Ok((cat, f.header.labels))
}

/// What differs between a manifest now and its stamp, where the manifest is still there (one
/// stat; a catalog file stands on its own once the manifest is gone).
fn manifest_changed(stamp: &SourceStamp) -> Option<String> {
    let SourceStamp::Manifest {
        path,
        bytes,
        mtime_ns,
        ..
    } = stamp
    else {
        return None;
    };
    let md = std::fs::metadata(path).ok()?;
    let now = mtime_of(&md);
    (md.len() != *bytes || now != *mtime_ns).then(|| {
        format!(
            "its manifest {path} is now {} bytes with mtime {now} ns, was {bytes} bytes with \
             mtime {mtime_ns} ns",
            md.len()
        )
    })
}

/// A file's modification time in nanoseconds since the epoch.
fn mtime_of(md: &std::fs::Metadata) -> i128 {
    use std::os::unix::fs::MetadataExt;
    md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128
}

/// The stamp of manifest `path` as it is now.
fn manifest_stamp(path: &Path) -> Result<SourceStamp, DaemonError> {
    let err = |e: std::io::Error| DaemonError::Setup(format!("manifest {}: {e}", path.display()));
    let bytes = std::fs::read(path).map_err(err)?;
    let md = std::fs::metadata(path).map_err(err)?;
    Ok(SourceStamp::Manifest {
        path: std::path::absolute(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string(),
        bytes: bytes.len() as u64,
        mtime_ns: mtime_of(&md),
        crc32: crc32fast::hash(&bytes),
    })
}

/// How `cfg` labels a catalog built from `cat` (what a header says).
fn labels_origin(cfg: &MountConfig, cat: &Catalog, from_manifest: bool) -> Option<String> {
    if let Some(name) = &cfg.label_hdf5 {
        return Some(hdf5_labels_origin(name));
    }
    cat.labels()?;
    Some(if from_manifest && !cfg.label_from_dirs {
        "manifest (or first directory where it has none)".into()
    } else {
        "first directory".into()
    })
}

/// Writes the catalog file of `cfg`'s source to `out` (keeping a current one of the same
/// source and labels already there, unless `fresh`); `made_by` goes into its header.
pub async fn make_catalog_file(
    cfg: &MountConfig,
    out: &Path,
    fresh: bool,
    made_by: &str,
) -> Result<MadeCatalog, DaemonError> {
    if cfg.hdf5_container {
        return Err(DaemonError::Setup(
            "HDF5 container mode reads its containers' rows at each mount; it has no catalog \
             file"
                .into(),
        ));
    }
    let tier = open_tier(&cfg.source, &cfg.s3, cfg.stager.timeout_secs)?;
    let mut replaced = None;
    if !fresh && std::fs::symlink_metadata(out).is_ok() {
        match keep_reason(&*tier, cfg, out).await? {
            Ok(header) => {
                return Ok(MadeCatalog {
                    header,
                    kept: true,
                    replaced: None,
                })
            }
            Err(why) => replaced = Some(why),
        }
    }
    let (mut cat, stamp, from_manifest) = match &cfg.manifest {
        Some(m) => (read_manifest(m, cfg)?, manifest_stamp(m)?, true),
        None => {
            let cat = list_catalog(&*tier, cfg).await?;
            let stamp = listing_stamp(&*tier, &cat);
            (cat, stamp, false)
        }
    };
    if cfg.label_hdf5.is_some() {
        label_by_hdf5(&mut cat, cfg).await?;
    }
    let labels = labels_origin(cfg, &cat, from_manifest);
    let file = CatalogFile::new(cat, stamp, labels, made_by);
    let path = out.to_path_buf();
    let (file, written) = tokio::task::spawn_blocking(move || {
        let r = file.write(&path);
        (file, r)
    })
    .await
    .expect("writing the catalog file panicked");
    written?;
    Ok(MadeCatalog {
        header: file.header,
        kept: false,
        replaced,
    })
}

/// The stamp of a listing of `tier` into `cat`.
fn listing_stamp(tier: &dyn CapacityTier, cat: &Catalog) -> SourceStamp {
    match cat.dir_stamps().iter().find(|s| s.dir.is_empty()) {
        Some(root) if !tier.url().contains("://") => SourceStamp::Posix {
            root_mtime_ns: root.mtime_ns,
            dirs: cat.dir_stamps().len() as u64,
        },
        _ => SourceStamp::ObjectStore,
    }
}

/// The header of the catalog file at `out` when it can be kept for `cfg` (same source and
/// labels, still current), else why not.
async fn keep_reason(
    tier: &dyn CapacityTier,
    cfg: &MountConfig,
    out: &Path,
) -> Result<Result<metfs_tier::catalog::CatalogFileHeader, String>, DaemonError> {
    let old = match CatalogFile::read(out) {
        Ok(f) => f,
        Err(e) => return Ok(Err(e.to_string())),
    };
    if let Err(e) = old.check_source(out, tier.url()) {
        return Ok(Err(e.to_string()));
    }
    let h = &old.header;
    if let Some(name) = &cfg.label_hdf5 {
        if h.labels.as_deref() != Some(hdf5_labels_origin(name).as_str()) {
            return Ok(Err(format!("it was not labelled by HDF5 {name}")));
        }
    }
    let current = match (&h.stamp, &cfg.manifest) {
        (SourceStamp::Manifest { path, crc32, .. }, Some(m)) => {
            let now = manifest_stamp(m)?;
            matches!(now, SourceStamp::Manifest { path: p, crc32: c, .. } if p == *path && c == *crc32)
        }
        (SourceStamp::Manifest { .. }, None) | (_, Some(_)) => {
            return Ok(Err(
                "it was made from another kind of input (manifest or listing)".into(),
            ))
        }
        _ => {
            tier.catalog_stamp_differs(&old.catalog).await?.is_none()
                && tier.catalog_is_current(&old.catalog).await?
        }
    };
    Ok(if current {
        Ok(old.header)
    } else {
        Err("the source changed since it was made".into())
    })
}
