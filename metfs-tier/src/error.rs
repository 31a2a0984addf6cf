//! [`TierError`]: what a tier's operations fail with, sorted by whose the fault is (the
//! source's, the sample's, the cache's).

use thiserror::Error;

/// Errors of capacity tiers.
#[derive(Debug, Error)]
pub enum TierError {
    /// The source itself is missing or not usable.
    #[error("source {url}: {reason}")]
    BadSource { url: String, reason: String },
    /// A sample is gone.
    #[error("{url}: sample `{path}` no longer exists")]
    NotFound { url: String, path: String },
    /// A sample changed since the catalog was made, or while it was copied.
    #[error("{url}: sample `{path}` changed since it was catalogued (expected {expected}, found {found}); remount to re-catalogue (from a catalog file: make it again with `metfs catalog`)")]
    Changed {
        url: String,
        path: String,
        expected: String,
        found: String,
    },
    /// A sample resolves to somewhere outside the source.
    #[error("{url}: sample `{path}` resolves outside the source and is not served")]
    Escapes { url: String, path: String },
    /// Credentials were refused.
    #[error("{url}: access denied: {reason}")]
    Auth { url: String, reason: String },
    /// The tier could not be reached (after retries).
    #[error("{url}: unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    /// Any other I/O failure on one sample.
    #[error("{url}: `{path}`: {source}")]
    Io {
        url: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A catalogued sample is no longer a regular file (a FIFO, socket or device in its place).
    #[error("{url}: sample `{path}` is not a regular file ({kind}) and is not served")]
    NotRegular {
        url: String,
        path: String,
        kind: String,
    },
    /// A tier operation made no progress for too long (a hung file system or server).
    #[error("{url}: `{path}`: no progress for {secs} s")]
    Timeout {
        url: String,
        path: String,
        secs: u64,
    },
    /// Writing the local copy failed (cache full, disk error).
    #[error("writing the cache copy of `{path}`: {source}")]
    Local {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The listed samples do not make a catalog (a bad path, the same path twice, more samples
    /// than ids).
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
}

/// A [`TierError::Local`] about `path`'s copy.
pub(crate) fn local(path: &str, source: std::io::Error) -> TierError {
    TierError::Local {
        path: path.to_string(),
        source,
    }
}
