//! `catalog.bin`: the catalog saved in the cache, and loaded back with every offset, id and
//! path checked, so a damaged file is refused instead of trusted.

use std::io::{Read, Write};
use std::path::Path;

use super::{validate_rel_path, Catalog, CatalogError};

pub(super) const MAGIC: &[u8; 8] = b"METFSCA2";

impl Catalog {
    /// Writes the catalog atomically (`metfs-durable`: temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<u64, CatalogError> {
        let bytes = self.to_bytes(&path.display().to_string())?;
        metfs_durable::write_with(path, metfs_durable::Durability::File, |f| {
            f.write_all(&bytes)
        })
        .map_err(CatalogError::Save)?;
        Ok(bytes.len() as u64)
    }

    /// The bytes [`Catalog::save`] writes (the body of a catalog file too); `name` names their
    /// destination in errors.
    pub fn to_bytes(&self, name: &str) -> Result<Vec<u8>, CatalogError> {
        let mut out = MAGIC.to_vec();
        postcard::to_io(self, &mut out).map_err(|e| CatalogError::Corrupt {
            path: name.to_string(),
            reason: e.to_string(),
        })?;
        Ok(out)
    }

    /// Reads a catalog written by [`Catalog::save`].
    pub fn load(path: &Path) -> Result<Self, CatalogError> {
        let mut buf = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|source| CatalogError::Io {
                path: path.display().to_string(),
                source,
            })?;
        Self::from_bytes(&buf, &path.display().to_string())
    }

    /// Reads the bytes of a file written by [`Catalog::save`] (received rather than read, as
    /// `metfs-shuffle`'s extra rank receives rank 0's), with the same checks as
    /// [`Catalog::load`]; `name` says where they came from in errors.
    pub fn from_bytes(buf: &[u8], name: &str) -> Result<Self, CatalogError> {
        let corrupt = |reason: String| CatalogError::Corrupt {
            path: name.to_string(),
            reason,
        };
        if buf.len() < MAGIC.len() || &buf[..MAGIC.len()] != MAGIC {
            return Err(corrupt("bad magic".into()));
        }
        let cat: Catalog =
            postcard::from_bytes(&buf[MAGIC.len()..]).map_err(|e| corrupt(e.to_string()))?;
        let n = cat.sizes.len();
        if cat.dir_of.len() != n
            || cat.names.len() != n
            || cat.versions.len() != n
            || cat.labels.as_ref().is_some_and(|l| l.len() != n)
            || cat.clusters.as_ref().is_some_and(|c| c.len() != n)
            || cat.metas.as_ref().is_some_and(|m| {
                m.owner_of.len() != n
                    || m.times.len() != n
                    || m.owner_of
                        .iter()
                        .any(|&o| o != u32::MAX && o as usize >= m.owners.len())
            })
            || cat.dir_of.iter().any(|&d| d as usize >= cat.dirs.len())
        {
            return Err(corrupt("inconsistent lengths".into()));
        }
        // The file is metfs's own but read back as untrusted input: every index and string
        // the accessors use unchecked is checked here, and every path must be one a view may
        // show, so that a damaged file is refused (and the source listed again), never a panic
        // or a path outside the source.
        for (what, arena) in [
            ("directories", &cat.dirs),
            ("names", &cat.names),
            ("versions", &cat.versions),
        ] {
            arena.check().map_err(|e| corrupt(format!("{what}: {e}")))?;
        }
        if cat
            .labels
            .as_ref()
            .is_some_and(|l| l.iter().any(|&x| x as usize >= cat.label_names.len()))
            || cat
                .clusters
                .as_ref()
                .is_some_and(|c| c.iter().any(|&x| x as usize >= cat.cluster_names.len()))
        {
            return Err(corrupt("a label or cluster id without a name".into()));
        }
        for i in 0..cat.dirs.len() {
            let d = cat.dirs.get(i);
            if !d.is_empty() {
                validate_rel_path(d).map_err(|e| corrupt(format!("directory {d:?}: {e}")))?;
            }
        }
        for i in 0..n {
            let name = cat.names.get(i);
            if name.contains('/') || validate_rel_path(name).is_err() {
                return Err(corrupt(format!("sample name {name:?} is not a file name")));
            }
        }
        Ok(cat)
    }
}
