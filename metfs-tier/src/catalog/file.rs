//! The catalog file: a catalog written once per dataset version (`metfs catalog`), from which
//! every node of a job mounts without listing the tier (`metfs mount --catalog FILE`).
//!
//! Layout (integers little-endian):
//!
//! ```text
//! magic        8 bytes   "METFSCAT"
//! format       u32       FILE_FORMAT (1)
//! header_len   u32       bytes of the header that follows
//! header       postcard  CatalogFileHeader: source URL, what identifies its version
//!                        (SourceStamp), how labels were made, sample and byte counts, the
//!                        digest of every sample's path, size and version, when and by which
//!                        metfs it was made, and the body's length and CRC-32
//! body         bytes     the catalog exactly as the cache's `catalog.bin` holds it
//!                        (`Catalog::to_bytes`), checked on load as that file is
//! ```
//!
//! The body reuses `catalog.bin`'s encoding and every check of [`Catalog::from_bytes`]; the
//! header adds what a file shared by a thousand nodes needs: a format version of its own (so a
//! file of another metfs is refused by name, not misread), the source it lists (so a mount of
//! another source refuses it), and a length and digest over the body (so a file cut short by a
//! full disk or a copy in progress is refused as truncated, and a damaged one as such).
//!
//! Invariants:
//! * a file is written whole or not at all (`metfs-durable`: temporary file, fsync, rename), so a
//!   node reading it while it is replaced sees the old file or the new one;
//! * [`CatalogFile::read`] returns only a file of [`FILE_FORMAT`] whose length and body digest
//!   match its header and whose body is a valid catalog of the header's source; anything else
//!   is [`CatalogError::FileRefused`] naming the file and the reason;
//! * the source's version is what the listing saw: for a POSIX tree every sample's size and
//!   mtime and every directory's mtime (in the body), and the root's mtime (in the stamp), which
//!   a mount compares cheaply; for an object store every sample's ETag; for a manifest its
//!   length, mtime and CRC-32.

use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Catalog, CatalogError};

/// First bytes of a catalog file.
pub const FILE_MAGIC: &[u8; 8] = b"METFSCAT";

/// The catalog file format this metfs writes and reads.
pub const FILE_FORMAT: u32 = 1;

/// Bytes before the header: magic, format, header length.
const PREFIX: usize = 16;

/// Largest header accepted: a source URL and a few numbers take well under this; a larger
/// length is damage, not a header.
const MAX_HEADER: u32 = 1 << 20;

/// What identifies the version of the source a catalog was made from, besides the samples'
/// own sizes and versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceStamp {
    /// A POSIX directory tree, listed: the root's modification time (it changes when an entry
    /// is added, removed or renamed at the top level) and how many directories it had.
    Posix { root_mtime_ns: i128, dirs: u64 },
    /// An object store prefix, listed: the samples' ETags are the version.
    ObjectStore,
    /// A manifest, read instead of a listing: its path, length, mtime and CRC-32.
    Manifest {
        path: String,
        bytes: u64,
        mtime_ns: i128,
        crc32: u32,
    },
}

/// What a catalog file says about itself before its body is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogFileHeader {
    /// The source URL the catalog lists, as `metfs mount` names it.
    pub source: String,
    /// What identifies the source's version.
    pub stamp: SourceStamp,
    /// How the labels were made (`first directory`, `manifest`, `HDF5 NAME`), if any.
    pub labels: Option<String>,
    /// Number of samples.
    pub samples: u64,
    /// Bytes of all samples.
    pub bytes: u64,
    /// CRC-32 of every sample's path, size and version ([`versions_digest`]): two files with
    /// the same digest describe the same dataset version.
    pub versions_digest: u32,
    /// When the file was made, seconds since the epoch.
    pub made_at_secs: i64,
    /// What made it (`metfs 0.1.0`).
    pub made_by: String,
    /// Bytes of the body.
    pub body_len: u64,
    /// CRC-32 of the body.
    pub body_crc32: u32,
}

/// A catalog with its header, as written to and read from a catalog file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogFile {
    /// What the file says about the catalog and its source.
    pub header: CatalogFileHeader,
    /// The samples.
    pub catalog: Catalog,
}

/// CRC-32 of every sample's path, size and version, in sample order.
pub fn versions_digest(catalog: &Catalog) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for id in 0..catalog.len() as u32 {
        let (dir, name) = catalog.dir_and_name(id);
        h.update(dir.as_bytes());
        h.update(b"/");
        h.update(name.as_bytes());
        h.update(&catalog.size(id).to_le_bytes());
        h.update(catalog.version(id).as_bytes());
        h.update(b"\n");
    }
    h.finalize()
}

impl CatalogFile {
    /// A catalog file of `catalog` (its source is the catalog's), made now by `made_by`.
    pub fn new(
        catalog: Catalog,
        stamp: SourceStamp,
        labels: Option<String>,
        made_by: &str,
    ) -> Self {
        let made_at_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let header = CatalogFileHeader {
            source: catalog.source().to_string(),
            stamp,
            labels,
            samples: catalog.len() as u64,
            bytes: catalog.total_bytes(),
            versions_digest: versions_digest(&catalog),
            made_at_secs,
            made_by: made_by.to_string(),
            body_len: 0,
            body_crc32: 0,
        };
        Self { header, catalog }
    }

    /// Writes the file atomically (temporary file, fsync, rename); returns its length.
    pub fn write(&self, path: &Path) -> Result<u64, CatalogError> {
        let body = self.catalog.to_bytes(&path.display().to_string())?;
        let mut header = self.header.clone();
        header.body_len = body.len() as u64;
        header.body_crc32 = crc32fast::hash(&body);
        let head = postcard::to_stdvec(&header).map_err(|e| CatalogError::Corrupt {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        metfs_durable::write_with(path, metfs_durable::Durability::FileAndDir, |f| {
            f.write_all(FILE_MAGIC)?;
            f.write_all(&FILE_FORMAT.to_le_bytes())?;
            f.write_all(&(head.len() as u32).to_le_bytes())?;
            f.write_all(&head)?;
            f.write_all(&body)
        })
        .map_err(CatalogError::Save)?;
        Ok((PREFIX + head.len() + body.len()) as u64)
    }

    /// Reads a file written by [`CatalogFile::write`], refusing (with the file and the reason)
    /// one that is truncated, of another format, damaged, or not a catalog file at all.
    pub fn read(path: &Path) -> Result<Self, CatalogError> {
        let name = path.display().to_string();
        let mut buf = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|source| CatalogError::Io {
                path: name.clone(),
                source,
            })?;
        Self::from_bytes(&buf, &name)
    }

    /// [`CatalogFile::read`] of bytes already read; `name` names them in errors.
    pub fn from_bytes(buf: &[u8], name: &str) -> Result<Self, CatalogError> {
        let refuse = |reason: String| CatalogError::FileRefused {
            path: name.to_string(),
            reason,
        };
        let header = parse_header(buf, name)?;
        let start = PREFIX + u32::from_le_bytes(buf[12..16].try_into().unwrap()) as usize;
        let have = (buf.len() - start) as u64;
        if have < header.body_len {
            return Err(refuse(format!(
                "truncated: {} bytes where its header announces {} (an interrupted copy or a \
                 full disk); make it again with `metfs catalog`",
                buf.len(),
                start as u64 + header.body_len
            )));
        }
        if have > header.body_len {
            return Err(refuse(format!(
                "{} bytes past the end its header announces",
                have - header.body_len
            )));
        }
        let body = &buf[start..];
        let crc = crc32fast::hash(body);
        if crc != header.body_crc32 {
            return Err(refuse(format!(
                "damaged: its body's CRC-32 is {crc:08x}, its header says {:08x}",
                header.body_crc32
            )));
        }
        let catalog = Catalog::from_bytes(body, name)?;
        if catalog.source() != header.source
            || catalog.len() as u64 != header.samples
            || versions_digest(&catalog) != header.versions_digest
        {
            return Err(refuse(
                "its header does not describe its catalog (source, count or digest)".into(),
            ));
        }
        Ok(Self { header, catalog })
    }

    /// Refuses the file unless it lists `source` (the mount's source URL).
    pub fn check_source(&self, path: &Path, source: &str) -> Result<(), CatalogError> {
        if same_source(&self.header.source, source) {
            return Ok(());
        }
        Err(CatalogError::OtherSource {
            path: path.display().to_string(),
            catalogued: self.header.source.clone(),
            mount_source: source.to_string(),
        })
    }
}

/// Whether two source URLs name the same source: equal but for a trailing `/`.
fn same_source(a: &str, b: &str) -> bool {
    let trim = |s: &str| -> String {
        let t = s.trim_end_matches('/');
        if t.is_empty() { s } else { t }.to_string()
    };
    trim(a) == trim(b)
}

/// The header of a catalog file, with its magic and format version checked.
fn parse_header(buf: &[u8], name: &str) -> Result<CatalogFileHeader, CatalogError> {
    let refuse = |reason: String| CatalogError::FileRefused {
        path: name.to_string(),
        reason,
    };
    if buf.len() >= 8 && &buf[..8] == super::persist::MAGIC {
        return Err(refuse(
            "this is a mount's cached catalog.bin, not a catalog file; make one with \
             `metfs catalog SOURCE -o FILE`"
                .into(),
        ));
    }
    if buf.len() < PREFIX {
        if FILE_MAGIC.starts_with(&buf[..buf.len().min(8)]) {
            return Err(refuse(format!(
                "truncated: {} bytes, shorter than its header",
                buf.len()
            )));
        }
        return Err(refuse(
            "not a metfs catalog file (no METFSCAT magic)".into(),
        ));
    }
    if &buf[..8] != FILE_MAGIC {
        return Err(refuse(
            "not a metfs catalog file (no METFSCAT magic)".into(),
        ));
    }
    let format = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    if format != FILE_FORMAT {
        return Err(refuse(format!(
            "format version {format}, but this metfs reads version {FILE_FORMAT}; make it again \
             with this metfs's `metfs catalog`"
        )));
    }
    let len = u32::from_le_bytes(buf[12..16].try_into().unwrap());
    if len > MAX_HEADER {
        return Err(refuse(format!("damaged: a header of {len} bytes")));
    }
    if buf.len() < PREFIX + len as usize {
        return Err(refuse(format!(
            "truncated: {} bytes, shorter than its {len}-byte header",
            buf.len()
        )));
    }
    postcard::from_bytes(&buf[PREFIX..PREFIX + len as usize])
        .map_err(|e| refuse(format!("damaged header: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::CatalogEntry;

    fn sample() -> CatalogFile {
        let mut c = Catalog::from_entries(
            "/data/set",
            vec![
                CatalogEntry::new("a/x.bin", 10),
                CatalogEntry::new("b/y.bin", 20),
            ],
        )
        .unwrap();
        c.label_by_first_dir();
        let stamp = SourceStamp::Posix {
            root_mtime_ns: 7,
            dirs: 3,
        };
        CatalogFile::new(c, stamp, Some("first directory".into()), "metfs test")
    }

    fn refused(r: Result<CatalogFile, CatalogError>) -> String {
        match r {
            Err(e @ CatalogError::FileRefused { .. }) => e.to_string(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_catalog_file_reads_back_as_written() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cat");
        let f = sample();
        let len = f.write(&p).unwrap();
        assert_eq!(len, std::fs::metadata(&p).unwrap().len());
        let back = CatalogFile::read(&p).unwrap();
        assert_eq!(back.catalog, f.catalog);
        assert_eq!(back.header.stamp, f.header.stamp);
        assert_eq!(back.header.samples, 2);
        assert_eq!(back.header.bytes, 30);
        assert_eq!(back.header.versions_digest, versions_digest(&f.catalog));
        back.check_source(&p, "/data/set/").unwrap();
        let e = back
            .check_source(&p, "/data/other")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/data/set") && e.contains("/data/other") && e.contains("cat"),
            "{e}"
        );
    }

    #[test]
    fn truncated_other_format_damaged_and_foreign_files_are_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cat");
        sample().write(&p).unwrap();
        let good = std::fs::read(&p).unwrap();
        let name = p.display().to_string();
        for cut in [3, 12, 20, good.len() - 1] {
            let e = refused(CatalogFile::from_bytes(&good[..cut], &name));
            assert!(e.contains("truncated") && e.contains(&name), "{cut}: {e}");
        }
        let mut other = good.clone();
        other[8..12].copy_from_slice(&2u32.to_le_bytes());
        let e = refused(CatalogFile::from_bytes(&other, &name));
        assert!(e.contains("format version 2"), "{e}");
        let mut damaged = good.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        assert!(refused(CatalogFile::from_bytes(&damaged, &name)).contains("damaged"));
        let mut longer = good.clone();
        longer.push(0);
        assert!(refused(CatalogFile::from_bytes(&longer, &name)).contains("past the end"));
        assert!(refused(CatalogFile::from_bytes(b"hello, world, hi", &name)).contains("magic"));
        let cache = d.path().join("catalog.bin");
        sample().catalog.save(&cache).unwrap();
        assert!(refused(CatalogFile::read(&cache)).contains("catalog.bin"));
    }

    #[test]
    fn the_versions_digest_follows_sizes_and_versions() {
        let f = sample();
        let mut e = CatalogEntry::new("a/x.bin", 10);
        e.version = "123".into();
        let c =
            Catalog::from_entries("/data/set", vec![e, CatalogEntry::new("b/y.bin", 20)]).unwrap();
        assert_ne!(versions_digest(&c), f.header.versions_digest);
        let c = Catalog::from_entries(
            "/data/set",
            vec![
                CatalogEntry::new("a/x.bin", 10),
                CatalogEntry::new("b/y.bin", 20),
            ],
        )
        .unwrap();
        assert_eq!(versions_digest(&c), f.header.versions_digest);
    }
}
