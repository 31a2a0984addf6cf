//! Walking a POSIX source depth first: every servable file with its metadata (a symlink is
//! followed only to a file inside the root), every directory's stamp, and what was left out
//! with why; into a [`Listing`] or straight into a catalog builder.

use std::path::PathBuf;

use crate::catalog::{CatalogBuilder, CatalogEntry, CatalogError, DirStamp, Meta};
use crate::{Catalogued, Listing, TierError};

use super::{mtime_ns, posix_version, PosixTier};

/// What a walk of a POSIX source found besides its files.
struct Walked {
    dir_stamps: Vec<DirStamp>,
    skipped: Vec<(String, String)>,
}

impl PosixTier {
    /// The listing, entry by entry.
    pub(super) fn list_blocking(
        &self,
        progress: &std::sync::atomic::AtomicU64,
    ) -> Result<Listing, TierError> {
        let mut entries = Vec::new();
        let Walked {
            dir_stamps,
            skipped,
        } = self.walk(progress, &mut |rel, md| {
            entries.push(CatalogEntry {
                path: rel.to_string(),
                size: md.len(),
                version: posix_version(md),
                label: None,
                cluster: None,
                meta: Some(Meta::from_metadata(md)),
            });
            Ok(())
        })?;
        Ok(Listing {
            entries,
            dir_stamps,
            skipped,
        })
    }

    /// The listing pushed into a catalog builder entry by entry: no `CatalogEntry` is made.
    pub(super) fn catalog_blocking(
        &self,
        progress: &std::sync::atomic::AtomicU64,
    ) -> Result<Catalogued, TierError> {
        let mut b = CatalogBuilder::default();
        let build_err = |e| TierError::Catalog(CatalogError::from_build(&self.url, e));
        let Walked {
            dir_stamps,
            skipped,
        } = self.walk(progress, &mut |rel, md| {
            b.push(rel, md.len(), &posix_version(md), None, None)
                .map_err(build_err)?;
            b.push_meta(Some(Meta::from_metadata(md)));
            Ok(())
        })?;
        let mut catalog = b.finish(&self.url).map_err(build_err)?;
        catalog.set_dir_stamps(dir_stamps);
        Ok(Catalogued { catalog, skipped })
    }

    /// Walks the source depth first, calling `on_file` with the relative path and metadata of
    /// every servable file (a symlink's are its target's); returns every directory's stamp and
    /// what was left out, with why.
    fn walk(
        &self,
        progress: &std::sync::atomic::AtomicU64,
        on_file: &mut dyn FnMut(&str, &std::fs::Metadata) -> Result<(), TierError>,
    ) -> Result<Walked, TierError> {
        let mut dir_stamps = Vec::new();
        let mut skipped = Vec::new();
        let mut stack: Vec<(PathBuf, String)> = vec![(self.root.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let md = std::fs::metadata(&dir).map_err(|e| self.io_err(&rel, e))?;
            dir_stamps.push(DirStamp {
                dir: rel.clone(),
                mtime_ns: mtime_ns(&md),
                meta: Some(Meta::from_metadata(&md)),
            });
            let rd = std::fs::read_dir(&dir).map_err(|e| self.io_err(&rel, e))?;
            // One buffer for every child's relative path: most children are files, whose path
            // the callback copies where it keeps it.
            let mut child_rel = String::with_capacity(rel.len() + 64);
            for ent in rd {
                progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let ent = ent.map_err(|e| self.io_err(&rel, e))?;
                let name = ent.file_name();
                let Some(name) = name.to_str() else {
                    skipped.push((
                        format!("{rel}/{}", name.to_string_lossy()),
                        "name is not UTF-8".into(),
                    ));
                    continue;
                };
                child_rel.clear();
                if !rel.is_empty() {
                    child_rel.push_str(&rel);
                    child_rel.push('/');
                }
                child_rel.push_str(name);
                let path = ent.path();
                let lmd = ent.metadata().map_err(|e| self.io_err(&child_rel, e))?;
                let ft = lmd.file_type();
                if ft.is_dir() {
                    stack.push((path, child_rel.clone()));
                } else if ft.is_file() {
                    on_file(&child_rel, &lmd)?;
                } else if ft.is_symlink() {
                    match std::fs::canonicalize(&path) {
                        Ok(target) if target.starts_with(&self.root) => {
                            match std::fs::metadata(&target) {
                                Ok(md) if md.is_file() => on_file(&child_rel, &md)?,
                                Ok(_) => skipped.push((
                                    child_rel.clone(),
                                    "symlink to a directory is not followed (cycles)".into(),
                                )),
                                Err(e) => {
                                    skipped.push((child_rel.clone(), format!("symlink: {e}")))
                                }
                            }
                        }
                        Ok(target) => skipped.push((
                            child_rel.clone(),
                            format!("symlink leads outside the source (to {})", target.display()),
                        )),
                        Err(e) => {
                            skipped.push((child_rel.clone(), format!("dangling symlink: {e}")))
                        }
                    }
                } else {
                    skipped.push((child_rel.clone(), "not a regular file".to_string()));
                }
            }
        }
        Ok(Walked {
            dir_stamps,
            skipped,
        })
    }
}
