//! Stable digests: FNV-1a over bytes, and the catalog's digest built on it.
//!
//! Why not `std::hash`: its `DefaultHasher` may change between Rust releases, and these values
//! are stored (`state.json`, a dynamic-sharding queue's record in etcd, the mount registry's
//! file names) or compared between nodes that may run different builds. FNV-1a is fixed by its
//! definition, and fast enough for the byte counts here (a catalog's paths, once per mount).

use crate::CatalogSamples;

/// A 64-bit FNV-1a hasher.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv1a {
    /// The offset basis: the digest of nothing.
    pub const fn new() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    /// Feeds `bytes`.
    pub fn write(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
        self
    }

    /// Feeds `x` as its 8 little-endian bytes.
    pub fn write_u64(&mut self, x: u64) -> &mut Self {
        self.write(&x.to_le_bytes())
    }

    /// The digest so far.
    pub const fn finish(&self) -> u64 {
        self.0
    }

    /// The digest of `bytes` alone.
    pub fn of(bytes: &[u8]) -> u64 {
        Fnv1a::new().write(bytes).finish()
    }
}

/// What [`catalog_digest`] covers beyond every sample's path, size and content version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogDigest {
    /// Paths, sizes and versions: the mount's plan fingerprint (a relabelled dataset is the
    /// same plan).
    Contents,
    /// Also each sample's class, each sample's record ended by a newline: the identity a
    /// dynamic-sharding queue is made for (a class changes what stratified shards hold).
    ContentsAndLabels,
}

/// The digest of `catalog`, every sample in catalog order. The two kinds give the values
/// earlier versions stored, so saved positions and existing queues still match.
pub fn catalog_digest<C: CatalogSamples + ?Sized>(catalog: &C, kind: CatalogDigest) -> u64 {
    let mut h = Fnv1a::new();
    let labels = kind == CatalogDigest::ContentsAndLabels;
    for id in 0..catalog.len() as u32 {
        let (d, n) = catalog.dir_and_name(id);
        h.write(d.as_bytes()).write(b"/").write(n.as_bytes());
        h.write_u64(catalog.size(id));
        h.write(catalog.version(id).as_bytes());
        if labels {
            if let Some(l) = catalog.label(id) {
                h.write(l.as_bytes());
            }
            h.write(b"\n");
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_the_published_function() {
        // Test vectors of the FNV reference (64-bit FNV-1a).
        assert_eq!(Fnv1a::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv1a::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv1a::of(b"foobar"), 0x8594_4171_f739_67e8);
        let mut h = Fnv1a::new();
        h.write(b"foo").write(b"bar");
        assert_eq!(h.finish(), Fnv1a::of(b"foobar"));
    }
}
