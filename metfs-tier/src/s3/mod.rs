//! S3 (and S3-compatible stores: MinIO, Garage, Ceph RGW) as a capacity tier.
//!
//! A source `s3://BUCKET/PREFIX` is the set of objects whose keys start with `PREFIX/`; the key
//! below the prefix is the sample's relative path in the view. [`S3Tier`] implements
//! [`CapacityTier`] with `object_store`'s [`AmazonS3`] client for everything that reads object
//! bytes, and with its own `ListObjectsV2` pagination for the listing.
//!
//! # Why the listing does not use `object_store::ObjectStore::list`
//!
//! `object_store` turns every listed key into an `object_store::path::Path`, which silently
//! strips a leading or trailing `/` (so `/abs` becomes `abs`, and a directory marker `a/` becomes
//! a sample `a` that then collides with `a/x`) and fails the whole page, and with it the whole
//! listing, on a key with an empty or `..` segment. metfs must instead leave such keys out and say
//! which and why, so the listing sends `ListObjectsV2` itself: the request is presigned by
//! `object_store` ([`Signer::signed_url_opts`](object_store::signer::Signer::signed_url_opts), so endpoint, region, path style and credentials
//! resolve exactly as for the reads), asks for `encoding-type=url` so that any key survives the
//! XML, and is retried with the same [`S3RetryConfig`] policy as the reads (`object_store`'s retry
//! machinery is crate-private, hence the small loop in `S3Tier::list_page`). Pages are turned
//! into catalog entries one at a time; nothing but the entries is kept.
//!
//! # Fetching
//!
//! An object no larger than one piece is fetched with one GET; a larger one with ranged GETs of
//! one piece each, up to [`S3Config::max_parallel_parts`] at once, each streamed into the
//! destination file at its offset in batches of at most [`WRITE_BATCH`] bytes: the response's
//! frames are kept as they arrived (not copied into a buffer) and written with one `pwritev`
//! on a blocking thread, so no object is ever held whole in memory and no byte is copied
//! twice on its way to the page cache. A piece is
//! [`S3Config::part_size`], capped at the pacer's chunk (8 MiB without a bandwidth cap, 256 KiB
//! with one): the pacer is asked for a piece's bytes before its request is sent, so a cap holds without stretching a request
//! past its timeout. All requests of one tier share [`S3Config::max_requests`] permits, which
//! bounds the connections (the HTTP pool keeps that many idle ones per host) and the memory in
//! flight (permits × [`WRITE_BATCH`] × 2).
//!
//! A copy cut short is continued (`fetch_from`) with ranged GETs of the rest. Pieces finish in
//! any order, so the copy's length says nothing; the caller's [`Written`] is raised to the end
//! of the run of finished pieces from the first, which is what a continuation starts from.
//! An object without a catalogued ETag is not continued (nothing would pin the rest to the
//! version of the bytes already there).
//!
//! # Invariants
//!
//! * Every GET carries `If-Match: <catalogued ETag>`, and the response's ETag and total size are
//!   checked against the catalog, so bytes of two versions of an object are never mixed and an
//!   object changed since cataloguing fails with [`TierError::Changed`] naming the key. When the
//!   catalog has no ETag (a manifest without versions), the first part's ETag pins the rest.
//! * Exactly the catalogued number of bytes is written, or the fetch fails.
//! * A key that would escape the view (`..`, `.`, empty segments, absolute) or is a directory
//!   marker never becomes a sample: it is listed in [`Listing::skipped`] with its reason, and
//!   [`S3Tier::fetch`] refuses such paths with [`TierError::Escapes`].
//! * Secrets (secret key, session token, presigned signatures) never appear in [`S3Tier::url`],
//!   in `Debug` output, in logs or in errors: error text from the server or the HTTP stack passes
//!   through a scrubber that removes them.
//!
//! # Configuration
//!
//! [`S3Config`] fields win over the standard `AWS_*` environment variables (`AWS_ENDPOINT_URL`,
//! `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_ALLOW_HTTP`, ...), which win over `object_store`'s credential chain (web identity, ECS /
//! EKS container credentials, EC2 instance metadata). `object_store` does not read
//! `~/.aws/credentials` profiles.
//!
//! # Layout
//!
//! This file holds [`S3Tier`] and its [`CapacityTier`] implementation; `config` the settings,
//! `client` opening the tier (URL, environment, clients), `listing` the `ListObjectsV2` walk
//! and key classification, `fetch` the ranged GETs and vectored writes, and `errors` the
//! mapping of server and transport failures to [`TierError`] with the secret scrubber.

use std::collections::HashSet;
use std::ops::{ControlFlow, Range};
use std::sync::Arc;

use async_trait::async_trait;
use object_store::aws::AmazonS3;
use object_store::client::HttpClient;
use tokio::sync::Semaphore;

use crate::catalog::Catalog;
use crate::pacer::Pacer;
use crate::{CapacityTier, Listing, SampleRef, TierError, Written};

mod client;
mod config;
mod errors;
mod fetch;
mod listing;

pub use config::{S3Config, S3RetryConfig, Secret};
pub use fetch::WRITE_BATCH;

use listing::{catalog_has_dir, catalog_path_is, Item};

/// An S3 prefix as a capacity tier. See the module docs.
pub struct S3Tier {
    url: String,
    bucket: String,
    prefix: String,
    region: String,
    endpoint: String,
    cfg: S3Config,
    store: Arc<AmazonS3>,
    list_http: HttpClient,
    requests: Arc<Semaphore>,
    redact: Arc<Vec<String>>,
}

impl std::fmt::Debug for S3Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Tier")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("part_size", &self.cfg.part_size)
            .field("max_parallel_parts", &self.cfg.max_parallel_parts)
            .field("max_requests", &self.cfg.max_requests)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl CapacityTier for S3Tier {
    fn url(&self) -> &str {
        &self.url
    }

    async fn list(&self) -> Result<Listing, TierError> {
        let mut out = Listing::default();
        self.walk(|item| {
            match item {
                Item::Entry(e) => out.entries.push(e),
                Item::Skip(key, why) => {
                    tracing::warn!(tier = %self.url, key = %key, reason = %why, "key left out of the catalog");
                    out.skipped.push((key, why));
                }
            }
            ControlFlow::Continue(())
        })
        .await?;
        // An object store may hold both `a` and `a/b`; a view cannot show `a` as a file and a
        // directory at once. The directory wins: it usually is the dataset, and `a` a stray.
        let mut dirs: HashSet<&str> = HashSet::new();
        for e in &out.entries {
            let mut p = e.path.as_str();
            while let Some(i) = p.rfind('/') {
                p = &p[..i];
                if !dirs.insert(p) {
                    break;
                }
            }
        }
        let conflicts: HashSet<String> = out
            .entries
            .iter()
            .filter(|e| dirs.contains(e.path.as_str()))
            .map(|e| e.path.clone())
            .collect();
        drop(dirs);
        if !conflicts.is_empty() {
            out.entries.retain(|e| !conflicts.contains(&e.path));
            let mut conflicts: Vec<String> = conflicts.into_iter().collect();
            conflicts.sort();
            for rel in conflicts {
                let key = self.key_of(&rel);
                let why = format!(
                    "key `{key}` is also a directory of other keys; a view cannot show a file and \
                     a directory under one name, so the directory is kept"
                );
                tracing::warn!(tier = %self.url, key = %key, "key left out of the catalog: file/directory clash");
                out.skipped.push((key, why));
            }
        }
        Ok(out)
    }

    /// A catalog is current when a fresh listing yields exactly its samples with the same sizes
    /// and ETags. Object stores have no cheap change stamp for a prefix (no directory mtimes),
    /// so this walks the listing page by page against the catalog in order (both are sorted by
    /// key) and stops at the first difference; nothing but one page is held. A catalog that did
    /// not come from this tier's listing (its source is another URL, e.g. a manifest) is never
    /// current here: the tier cannot vouch for a manifest, and re-reading one is cheap.
    async fn catalog_is_current(&self, catalog: &Catalog) -> Result<bool, TierError> {
        if catalog.source() != self.url {
            return Ok(false);
        }
        let n = catalog.len() as u32;
        let mut next = 0u32;
        let mut same = true;
        self.walk(|item| {
            let Item::Entry(e) = item else {
                return ControlFlow::Continue(());
            };
            if next < n && catalog_path_is(catalog, next, &e.path) {
                if catalog.size(next) != e.size || catalog.version(next) != e.version {
                    same = false;
                    return ControlFlow::Break(());
                }
                next += 1;
                ControlFlow::Continue(())
            } else if catalog_has_dir(catalog, &e.path) {
                // Left out by `list` as a file/directory clash.
                ControlFlow::Continue(())
            } else {
                same = false;
                ControlFlow::Break(())
            }
        })
        .await?;
        Ok(same && next == n)
    }

    /// One HEAD of the catalog's first sample: its size and ETag against the catalogued ones.
    async fn catalog_stamp_differs(&self, catalog: &Catalog) -> Result<Option<String>, TierError> {
        if catalog.is_empty() {
            return Ok(None);
        }
        let path = catalog.path(0);
        let loc = self.locate(&path)?;
        let (size, etag) = (catalog.size(0), catalog.version(0));
        match object_store::ObjectStoreExt::head(&*self.store, &loc).await {
            Ok(m) if m.size == size && (etag.is_empty() || m.e_tag.as_deref() == Some(etag)) => {
                Ok(None)
            }
            Ok(m) => Ok(Some(format!(
                "`{path}` is now {} bytes with ETag {}, catalogued as {size} bytes with ETag {etag}",
                m.size,
                m.e_tag.as_deref().unwrap_or("(none)")
            ))),
            Err(object_store::Error::NotFound { .. }) => {
                Ok(Some(format!("`{path}` no longer exists")))
            }
            Err(e) => Err(self.store_error(Some(&path), e)),
        }
    }

    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError> {
        let loc = self.locate(&sample.path)?;
        let piece = self.piece_bytes(pacer);
        let expected = (!sample.version.is_empty()).then(|| sample.version.clone());
        if sample.size <= piece {
            self.fetch_piece(&loc, sample, None, expected, &dest, pacer)
                .await?;
            return Ok(sample.size);
        }
        let mut ranges = pieces(0..sample.size, piece);
        let etag = match expected {
            Some(e) => e,
            None => {
                // No catalogued version: the first part's ETag pins the others, so the parts
                // cannot come from two versions of the object.
                let first = ranges.next().expect("a large object has parts");
                self.fetch_piece(&loc, sample, Some(first), None, &dest, pacer)
                    .await?
                    .unwrap_or_default()
            }
        };
        let etag = (!etag.is_empty()).then_some(etag);
        self.fetch_pieces(&loc, sample, ranges, etag, &dest, pacer, None)
            .await?;
        Ok(sample.size)
    }

    /// Ranged GETs of the rest, pinned to the catalogued ETag (`If-Match`): a sample without
    /// one is not continued, since the bytes already there could be of another version.
    async fn fetch_from(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        from: u64,
        pacer: &Pacer,
        written: Arc<Written>,
    ) -> Result<Option<u64>, TierError> {
        if sample.version.is_empty() {
            return Ok(None);
        }
        let loc = self.locate(&sample.path)?;
        let from = from.min(sample.size);
        let ranges = pieces(from..sample.size, self.piece_bytes(pacer));
        let etag = Some(sample.version.clone());
        self.fetch_pieces(&loc, sample, ranges, etag, &dest, pacer, Some(&written))
            .await?;
        Ok(Some(sample.size - from))
    }
}

/// `range` cut into consecutive pieces of `piece` bytes (the last one shorter).
fn pieces(range: Range<u64>, piece: u64) -> impl Iterator<Item = Range<u64>> {
    let Range { start, end } = range;
    (0..(end - start).div_ceil(piece))
        .map(move |i| start + i * piece..(start + (i + 1) * piece).min(end))
}

#[cfg(test)]
mod tests;
