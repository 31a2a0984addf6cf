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
//! `object_store` ([`Signer::signed_url_opts`], so endpoint, region, path style and credentials
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

use std::collections::HashSet;
use std::ops::{ControlFlow, Range};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpClient, HttpConnector, HttpErrorKind, HttpRequestBody};
use object_store::path::Path as ObjPath;
use object_store::signer::{SignedUrlOptions, Signer};
use object_store::{
    BackoffConfig, ClientConfigKey, ClientOptions, GetOptions, GetRange, ObjectStore,
    ObjectStoreExt, RetryConfig,
};
use serde::{Deserialize, Deserializer, Serialize};
use tokio::sync::Semaphore;

use crate::catalog::{validate_rel_path, Catalog, CatalogEntry, Meta};
use crate::pacer::Pacer;
use crate::size::parse_size;
use crate::tier::{CapacityTier, Listing, SampleRef, TierError};

/// Largest batch of response bytes written to the destination with one `pwrite`. Big enough to
/// keep system calls and blocking-pool hops rare, small enough that 64 requests in flight hold
/// little memory.
pub const WRITE_BATCH: usize = 512 << 10;

/// How long a presigned listing URL stays valid. A page is requested right after signing, so
/// this only has to cover clock skew and one slow request.
const LIST_URL_TTL: Duration = Duration::from_secs(15 * 60);

/// A secret string (secret access key, session token). Read from configuration as a plain
/// string; never shown by `Debug` and never serialized.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for handing to the S3 client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Retry policy for S3 requests: throttling (503 SlowDown, 429), server errors (5xx), timeouts
/// and dropped connections, including a response body cut off midway (resumed from where it
/// stopped, on the same ETag).
///
/// The waits follow `object_store`'s "decorrelated jitter": each wait is drawn uniformly between
/// the first wait and `backoff_base` times the previous one, capped at `max_backoff_ms`. With
/// base 2 that grows only linearly on average (8 retries from 50 ms wait ~1 s in total, too
/// little to outlast a server restart), hence base 3. The defaults wait a median ~25 s and at
/// least ~4 s in 99 of 100 cases before a request fails, which outlasts a restart of a server
/// or a burst of throttling, and `retry_timeout_ms` stops a request on a tier that stays down
/// after 30 s, so that the daemon can report it while the current view keeps serving.
/// `object_store`'s own defaults (10 retries, 3 minutes) would hold a staging slot for minutes
/// on a dead endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3RetryConfig {
    /// Retries per request before it fails. Default 15 (see above for the resulting waits).
    pub max_retries: usize,
    /// First wait, and the least any wait can be, in milliseconds. Default 100: long enough
    /// that a throttling server sees the load drop, short enough for momentary trouble.
    pub init_backoff_ms: u64,
    /// Longest single wait in milliseconds. Default 5000, so a recovered server is noticed
    /// within seconds.
    pub max_backoff_ms: u64,
    /// Growth factor of the wait. Default 3 (see above).
    pub backoff_base: f64,
    /// No retry starts after this many milliseconds since the first attempt. Default 30000.
    /// Also bounds how long a request's signature must stay valid.
    pub retry_timeout_ms: u64,
}

impl Default for S3RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 15,
            init_backoff_ms: 100,
            max_backoff_ms: 5_000,
            backoff_base: 3.0,
            retry_timeout_ms: 30_000,
        }
    }
}

impl S3RetryConfig {
    /// The equivalent `object_store` retry configuration.
    pub fn to_object_store(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(self.init_backoff_ms),
                max_backoff: Duration::from_millis(self.max_backoff_ms),
                base: self.backoff_base,
            },
            max_retries: self.max_retries,
            retry_timeout: Duration::from_millis(self.retry_timeout_ms),
        }
    }
}

/// Settings of an S3 tier. Every field is optional in a configuration file (`[s3]` table);
/// `None` means "take it from the environment, else the default named here".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL, e.g. `http://127.0.0.1:3900` (Garage) or `https://s3.example.org` (MinIO,
    /// Ceph RGW). Default: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL` or `AWS_ENDPOINT` from the
    /// environment, else AWS's own endpoint for the region.
    pub endpoint: Option<String>,
    /// Signing region. Must equal the server's region (Garage: `s3_region` in garage.toml,
    /// MinIO: `us-east-1` unless configured), or requests fail with 400. Default: `AWS_REGION`,
    /// `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// Allow plain `http://` endpoints. Default: `AWS_ALLOW_HTTP`, else `false`, because data and
    /// requests would cross the network in clear text; a loopback test server needs `true`.
    pub allow_http: Option<bool>,
    /// Address the bucket as `https://BUCKET.endpoint/KEY` instead of `https://endpoint/BUCKET/KEY`.
    /// Default: `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`, else `false` (path style), which every
    /// S3-compatible store accepts without DNS set-up; AWS accepts both. With `true` and an
    /// explicit endpoint, the endpoint must already contain the bucket name.
    pub virtual_hosted_style: Option<bool>,
    /// Access key id. Default: `AWS_ACCESS_KEY_ID`, else the instance / container credential
    /// chain. Setting it here (with the secret) ignores the credentials in the environment.
    pub access_key_id: Option<String>,
    /// Secret access key, given together with `access_key_id`. Prefer `AWS_SECRET_ACCESS_KEY` in
    /// the environment to a configuration file. Never serialized, never shown.
    #[serde(skip_serializing)]
    pub secret_access_key: Option<Secret>,
    /// Session token of temporary credentials. Default: `AWS_SESSION_TOKEN` (only when the key
    /// comes from the environment too). Never serialized, never shown.
    #[serde(skip_serializing)]
    pub session_token: Option<Secret>,
    /// Size of one ranged GET for objects larger than this (`8MiB` or a byte count), capped at
    /// the pacer's chunk (8 MiB, or 256 KiB under a bandwidth cap). Default 8 MiB: large enough
    /// that per-request latency is amortized (AWS recommends 8–16 MiB ranges), small enough
    /// that a 64 MiB object is read by 8 requests in parallel.
    #[serde(deserialize_with = "de_size")]
    pub part_size: u64,
    /// Ranged GETs in flight for one object. Default 8: one TCP stream rarely fills a fast link,
    /// a handful do.
    pub max_parallel_parts: usize,
    /// Requests in flight for the whole tier, across all fetches. Default 64: above the
    /// stager's 32 concurrent samples so that large objects can add parallel parts, and the
    /// HTTP pool keeps that many connections open per host.
    pub max_requests: usize,
    /// Retry policy, see [`S3RetryConfig`].
    pub retry: S3RetryConfig,
    /// TCP connect timeout in milliseconds. Default 5000 (as `object_store`): a reachable
    /// endpoint answers in far less, an unreachable one should be retried soon.
    pub connect_timeout_ms: u64,
    /// Timeout of one whole request, body included, in milliseconds. Default 30000: one piece
    /// (8 MiB) needs about 2 MB/s to finish in time; a slower link needs a larger value or a
    /// smaller `part_size`. A timed-out request is retried.
    pub request_timeout_ms: u64,
    /// Idle connections are closed after this many milliseconds. Default 15000: shorter than the
    /// 20 s after which S3 and most servers drop idle connections, so the client rarely reuses a
    /// connection the server is closing.
    pub pool_idle_timeout_ms: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: None,
            allow_http: None,
            virtual_hosted_style: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            part_size: 8 << 20,
            max_parallel_parts: 8,
            max_requests: 64,
            retry: S3RetryConfig::default(),
            connect_timeout_ms: 5_000,
            request_timeout_ms: 30_000,
            pool_idle_timeout_ms: 15_000,
        }
    }
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(n),
        Size::Text(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

/// One listed key, classified.
enum Item {
    /// A servable sample.
    Entry(CatalogEntry),
    /// A key left out, with why.
    Skip(String, String),
}

/// One listed object: key (decoded, or the lossy form when not UTF-8), size, ETag and
/// Last-Modified in nanoseconds.
type Listed = (Result<String, String>, u64, String, Option<i64>);

/// One page of `ListObjectsV2`.
struct Page {
    /// The objects in listing order.
    objects: Vec<Listed>,
    /// Continuation token when more pages follow.
    next: Option<String>,
}

/// The result of one attempt at a request: done, failed for good, or worth retrying.
enum Attempt<T> {
    Done(T),
    Fatal(TierError),
    Transient(String),
}

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

/// Splits `s3://bucket/prefix` into a bucket and a clean prefix (no leading or trailing `/`).
fn parse_s3_url(url: &str) -> Result<(String, String), TierError> {
    let bad = |shown: &str, reason: &str| TierError::BadSource {
        url: shown.to_string(),
        reason: reason.to_string(),
    };
    let Some(rest) = url.strip_prefix("s3://") else {
        return Err(bad(
            url,
            "not an S3 URL: expected s3://BUCKET or s3://BUCKET/PREFIX",
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.contains('@') || bucket.contains(':') {
        // Never echo what may be credentials or a port written into the URL.
        return Err(bad(
            "s3://***",
            "credentials or ports cannot be written into an s3:// URL; use the endpoint setting \
             and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
        ));
    }
    if bucket.is_empty()
        || !bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(bad(
            url,
            "bucket names are made of letters, digits, `-`, `.` and `_`",
        ));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        validate_rel_path(prefix).map_err(|why| bad(url, &format!("prefix: {why}")))?;
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on" | "y"
    )
}

/// Text between `<tag>` and `</tag>` in an S3 XML error body (or error text quoting one), with
/// XML's predefined entities resolved.
fn xml_field(text: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = text.find(&open)? + open.len();
    let end = text[start..].find(&close)? + start;
    Some(
        text[start..end]
            .trim()
            .replace("&apos;", "'")
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

/// The HTTP status quoted in `object_store`'s error text ("... status code: 403 Forbidden ...").
fn quoted_status(text: &str) -> Option<u16> {
    let i = text.find("status code: ")? + "status code: ".len();
    text.get(i..i + 3)?.parse().ok()
}

/// The whole `source()` chain of an error as one line.
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

/// The transport error kind in an error's source chain, if the failure was one.
fn transport_kind(e: &(dyn std::error::Error + 'static)) -> Option<HttpErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<object_store::client::HttpError>() {
            return Some(h.kind());
        }
        cur = err.source();
    }
    None
}

/// Decodes a key of a `encoding-type=url` listing. S3 encodes a space as `+` (and `+` as
/// `%2B`), as botocore's decoder assumes.
fn decode_key(raw: &str) -> Result<String, String> {
    let plus = raw.replace('+', " ");
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(&plus).collect();
    String::from_utf8(bytes).map_err(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListBucketResult {
    #[serde(default)]
    contents: Vec<ListContent>,
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_continuation_token: Option<String>,
    #[serde(default)]
    encoding_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListContent {
    key: String,
    #[serde(default)]
    size: u64,
    #[serde(rename = "ETag", default)]
    e_tag: Option<String>,
    #[serde(default)]
    last_modified: Option<String>,
}

impl S3Tier {
    /// Opens `url` (`s3://BUCKET` or `s3://BUCKET/PREFIX`) with `cfg`, falling back to the
    /// process environment for what `cfg` leaves unset. No request is sent: a wrong bucket or
    /// wrong credentials show at the first [`CapacityTier::list`].
    pub fn new(url: &str, cfg: S3Config) -> Result<Self, TierError> {
        Self::with_env(url, cfg, std::env::vars())
    }

    /// As [`S3Tier::new`], with the `AWS_*` variables taken from `env` instead of the process
    /// environment (for tests, and for callers that resolve the environment themselves).
    pub fn with_env(
        url: &str,
        cfg: S3Config,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, TierError> {
        let (bucket, prefix) = parse_s3_url(url)?;
        let url = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        let bad = |reason: String| TierError::BadSource {
            url: url.clone(),
            reason,
        };
        if cfg.part_size == 0 || cfg.max_parallel_parts == 0 || cfg.max_requests == 0 {
            return Err(bad(
                "part_size, max_parallel_parts and max_requests must be at least 1".into(),
            ));
        }
        if cfg.connect_timeout_ms == 0 || cfg.request_timeout_ms == 0 {
            return Err(bad("timeouts must be positive".into()));
        }
        let explicit_creds = cfg.access_key_id.is_some() || cfg.secret_access_key.is_some();
        if cfg.access_key_id.is_some() != cfg.secret_access_key.is_some() {
            return Err(bad(
                "access_key_id and secret_access_key must be given together".into(),
            ));
        }

        let mut opts = ClientOptions::new()
            .with_connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .with_timeout(Duration::from_millis(cfg.request_timeout_ms))
            .with_pool_max_idle_per_host(cfg.max_requests)
            .with_pool_idle_timeout(Duration::from_millis(cfg.pool_idle_timeout_ms))
            .with_user_agent(object_store::HeaderValue::from_static(concat!(
                "metfs/",
                env!("CARGO_PKG_VERSION")
            )));
        let mut builder = AmazonS3Builder::new();
        let mut env_keys = Vec::new();
        for (name, value) in env {
            if !name.starts_with("AWS_") {
                continue;
            }
            let Ok(key) = name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() else {
                continue;
            };
            match key {
                // The URL names the bucket.
                AmazonS3ConfigKey::Bucket => continue,
                // Explicit credentials replace the environment's as a whole: mixing an explicit
                // key with an ambient session token would only produce signature errors.
                AmazonS3ConfigKey::AccessKeyId
                | AmazonS3ConfigKey::SecretAccessKey
                | AmazonS3ConfigKey::Token
                    if explicit_creds =>
                {
                    continue
                }
                AmazonS3ConfigKey::SkipSignature if truthy(&value) => {
                    return Err(bad(
                        "anonymous access (AWS_SKIP_SIGNATURE) is not supported: \
                                    the listing is signed; give credentials"
                            .into(),
                    ));
                }
                AmazonS3ConfigKey::Client(ck) => opts = opts.with_config(ck, value),
                key => env_keys.push((key, value)),
            }
        }
        for (key, value) in env_keys {
            builder = builder.with_config(key, value);
        }
        if let Some(h) = cfg.allow_http {
            opts = opts.with_allow_http(h);
        }
        builder = builder
            .with_bucket_name(&bucket)
            .with_retry(cfg.retry.to_object_store())
            .with_client_options(opts.clone());
        if let Some(e) = &cfg.endpoint {
            // The S3-specific endpoint variable would otherwise win over the explicit one.
            builder = builder
                .with_endpoint(e)
                .with_config(AmazonS3ConfigKey::S3Endpoint, e);
        }
        if let Some(r) = &cfg.region {
            builder = builder.with_region(r);
        }
        if let Some(v) = cfg.virtual_hosted_style {
            builder = builder.with_virtual_hosted_style_request(v);
        }
        if let (Some(k), Some(s)) = (&cfg.access_key_id, &cfg.secret_access_key) {
            builder = builder
                .with_access_key_id(k)
                .with_secret_access_key(s.expose());
            if let Some(t) = &cfg.session_token {
                builder = builder.with_token(t.expose());
            }
        }

        let mut redact = Vec::new();
        for key in [AmazonS3ConfigKey::SecretAccessKey, AmazonS3ConfigKey::Token] {
            if let Some(v) = builder.get_config_value(&key) {
                if v.len() >= 4 {
                    redact.push(v);
                }
            }
        }
        let scrub = |s: String| scrub_with(&redact, &s);
        let region = builder
            .get_config_value(&AmazonS3ConfigKey::Region)
            .unwrap_or_else(|| "us-east-1".to_string());
        let endpoint = builder
            .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
        let allow_http = opts
            .get_config_value(&ClientConfigKey::AllowHttp)
            .is_some_and(|v| truthy(&v));
        if let Some(ep) = &endpoint {
            if ep.contains('@') {
                return Err(bad(
                    "the endpoint URL must not carry credentials; use AWS_ACCESS_KEY_ID / \
                     AWS_SECRET_ACCESS_KEY"
                        .into(),
                ));
            }
            if ep.starts_with("http://") && !allow_http {
                return Err(bad(format!(
                    "endpoint {ep} is plain HTTP: set allow_http = true (or AWS_ALLOW_HTTP=true) \
                     to allow unencrypted requests"
                )));
            }
        }
        let store = builder
            .build()
            .map_err(|e| bad(scrub(format!("S3 client configuration: {e}"))))?;
        let list_http = object_store::client::ReqwestConnector::default()
            .connect(&opts)
            .map_err(|e| bad(scrub(format!("HTTP client configuration: {e}"))))?;
        let endpoint = endpoint.unwrap_or_else(|| format!("AWS S3 ({region})"));
        Ok(Self {
            url,
            bucket,
            prefix,
            region,
            endpoint,
            requests: Arc::new(Semaphore::new(cfg.max_requests)),
            cfg,
            store: Arc::new(store),
            list_http,
            redact: Arc::new(redact),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The prefix below the bucket, without leading or trailing `/` (empty for a whole bucket).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The endpoint the tier talks to (no credentials in it), for status displays.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The signing region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The settings the tier was made with.
    pub fn config(&self) -> &S3Config {
        &self.cfg
    }

    /// The object key of relative path `rel`.
    pub fn key_of(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// The `object_store` client of this tier (same endpoint, credentials, retries and
    /// connection pool), for tools and tests that upload or compare objects.
    pub fn store(&self) -> Arc<AmazonS3> {
        self.store.clone()
    }

    fn scrub(&self, s: &str) -> String {
        scrub_with(&self.redact, s)
    }

    /// Maps an HTTP error status and S3 error code to a tier error. `key` is the relative path
    /// for object requests, `None` for the listing.
    fn status_error(&self, key: Option<&str>, status: u16, code: &str, message: &str) -> TierError {
        let detail = self.scrub(&match (code.is_empty(), message.is_empty()) {
            (true, true) => format!("HTTP {status}"),
            (false, true) => format!("HTTP {status} {code}"),
            (_, false) => format!("HTTP {status} {code}: {message}"),
        });
        let url = self.url.clone();
        match (status, code) {
            (_, "NoSuchBucket") => TierError::BadSource {
                url,
                reason: format!("bucket `{}` does not exist ({detail})", self.bucket),
            },
            (404, _) if key.is_some() => TierError::NotFound {
                url,
                path: key.unwrap_or_default().to_string(),
            },
            (401 | 403, _) => {
                // Servers differ in codes: AWS says InvalidAccessKeyId / SignatureDoesNotMatch,
                // Garage says AccessDenied with the cause in the message.
                let msg = message.to_ascii_lowercase();
                let hint = if code == "InvalidAccessKeyId" || msg.contains("no such key") {
                    "the access key id is not known to the server"
                } else if code == "SignatureDoesNotMatch" || msg.contains("signature") {
                    "the secret key does not match the access key id"
                } else if matches!(code, "ExpiredToken" | "TokenRefreshRequired")
                    || msg.contains("expired")
                {
                    "the credentials have expired"
                } else {
                    "the server refused access: wrong credentials, or a key that may not read \
                     this bucket or prefix"
                };
                TierError::Auth {
                    url,
                    reason: format!(
                        "{hint} ({detail}); check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / \
                         AWS_SESSION_TOKEN or access_key_id / secret_access_key in the configuration"
                    ),
                }
            }
            (301 | 307 | 400, _) => TierError::BadSource {
                url,
                reason: format!(
                    "the server rejected the request ({detail}); check `region` (it must equal \
                     the server's region), `endpoint` and `virtual_hosted_style`"
                ),
            },
            (408 | 429 | 500..=599, _) => TierError::Unreachable {
                url,
                reason: format!("the server kept failing after retries ({detail})"),
            },
            _ => match key {
                Some(k) => TierError::Io {
                    url,
                    path: k.to_string(),
                    source: std::io::Error::other(detail),
                },
                None => TierError::BadSource {
                    url,
                    reason: detail,
                },
            },
        }
    }

    /// Maps an `object_store` error on relative path `key` (or the listing) to a tier error.
    /// `object_store` keeps its HTTP error types private, so the status and S3 error code are
    /// read from its error text.
    fn store_error(&self, key: Option<&str>, e: object_store::Error) -> TierError {
        let text = self.scrub(&chain_text(&e));
        let code = xml_field(&text, "Code").unwrap_or_default();
        let message = xml_field(&text, "Message").unwrap_or_default();
        let url = self.url.clone();
        match &e {
            object_store::Error::NotFound { .. } => self.status_error(key, 404, &code, &message),
            object_store::Error::PermissionDenied { .. } => {
                self.status_error(key, 403, &code, &message)
            }
            object_store::Error::Unauthenticated { .. } => {
                self.status_error(key, 401, &code, &message)
            }
            object_store::Error::InvalidPath { .. } => TierError::Escapes {
                url,
                path: key.unwrap_or_default().to_string(),
            },
            _ => {
                if let Some(kind) = transport_kind(&e) {
                    if !matches!(kind, HttpErrorKind::Decode | HttpErrorKind::Unknown) {
                        return TierError::Unreachable {
                            url,
                            reason: format!("{kind:?} failure after retries: {text}"),
                        };
                    }
                }
                if let Some(status) = quoted_status(&text) {
                    return self.status_error(key, status, &code, &message);
                }
                if text.to_ascii_lowercase().contains("credential") {
                    return TierError::Auth {
                        url,
                        reason: format!("no usable credentials: {text}"),
                    };
                }
                match key {
                    Some(k) => TierError::Io {
                        url,
                        path: k.to_string(),
                        source: std::io::Error::other(text),
                    },
                    None => TierError::Unreachable { url, reason: text },
                }
            }
        }
    }

    /// The `object_store` path of relative path `rel`, refusing paths that could escape the
    /// view or that `object_store` would rewrite.
    fn locate(&self, rel: &str) -> Result<ObjPath, TierError> {
        let escapes = || TierError::Escapes {
            url: self.url.clone(),
            path: rel.to_string(),
        };
        validate_rel_path(rel).map_err(|_| escapes())?;
        let key = self.key_of(rel);
        let path = ObjPath::parse(&key).map_err(|_| escapes())?;
        if path.as_ref() != key {
            return Err(escapes());
        }
        Ok(path)
    }

    /// Classifies one listed key.
    fn classify(
        &self,
        key: Result<String, String>,
        size: u64,
        etag: String,
        modified: Option<i64>,
    ) -> Item {
        let key = match key {
            Ok(k) => k,
            Err(lossy) => return Item::Skip(lossy, "the key is not valid UTF-8".into()),
        };
        let rel = if self.prefix.is_empty() {
            Some(key.as_str())
        } else {
            key.strip_prefix(&self.prefix)
                .and_then(|r| r.strip_prefix('/'))
        };
        let Some(rel) = rel else {
            return Item::Skip(key, "the key is outside the prefix".into());
        };
        if rel.is_empty() || rel.ends_with('/') {
            return Item::Skip(
                key,
                "directory marker (the key ends in `/`), not a sample".into(),
            );
        }
        if let Err(why) = validate_rel_path(rel) {
            let reason = format!("key `{key}` would escape the view: {why}");
            return Item::Skip(key, reason);
        }
        if rel.chars().any(|c| c.is_ascii_control()) {
            let reason = format!(
                "key `{}` contains control characters, which S3 clients cannot address",
                key.escape_debug()
            );
            return Item::Skip(key, reason);
        }
        Item::Entry(CatalogEntry {
            path: rel.to_string(),
            size,
            version: etag,
            label: None,
            cluster: None,
            // Objects have no owner or mode: readable by whoever may read the mount.
            meta: modified.map(|t| Meta {
                mode: 0o444,
                uid: Meta::NO_OWNER,
                gid: Meta::NO_OWNER,
                mtime_ns: t,
                ctime_ns: t,
            }),
        })
    }

    /// One attempt at one listing page.
    async fn list_attempt(&self, token: Option<&str>) -> Attempt<Page> {
        let mut query: Vec<(&str, String)> =
            vec![("list-type", "2".into()), ("encoding-type", "url".into())];
        if !self.prefix.is_empty() {
            query.push(("prefix", format!("{}/", self.prefix)));
        }
        if let Some(t) = token {
            query.push(("continuation-token", t.to_string()));
        }
        let signed = self
            .store
            .signed_url_opts(
                http::Method::GET,
                &ObjPath::ROOT,
                LIST_URL_TTL,
                &SignedUrlOptions::new().with_query(query),
            )
            .await;
        let url = match signed {
            Ok(u) => u,
            Err(e) => return Attempt::Fatal(self.store_error(None, e)),
        };
        let request = match http::Request::builder()
            .method(http::Method::GET)
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
        {
            Ok(r) => r,
            Err(e) => {
                return Attempt::Fatal(TierError::BadSource {
                    url: self.url.clone(),
                    reason: format!("cannot build the listing request: {e}"),
                })
            }
        };
        let response = match self.list_http.execute(request).await {
            Ok(r) => r,
            Err(e) => {
                let text = self.scrub(&chain_text(&e));
                return match e.kind() {
                    HttpErrorKind::Decode | HttpErrorKind::Unknown => {
                        Attempt::Fatal(TierError::Unreachable {
                            url: self.url.clone(),
                            reason: text,
                        })
                    }
                    kind => Attempt::Transient(format!("{kind:?} failure: {text}")),
                };
            }
        };
        let status = response.status().as_u16();
        let body = match response.into_body().bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Attempt::Transient(format!(
                    "listing body cut off: {}",
                    self.scrub(&chain_text(&e))
                ))
            }
        };
        let text = String::from_utf8_lossy(&body);
        if !(200..300).contains(&status) {
            if status >= 500 || status == 429 || status == 408 {
                return Attempt::Transient(format!(
                    "HTTP {status} {}",
                    xml_field(&text, "Code").unwrap_or_default()
                ));
            }
            let code = xml_field(&text, "Code").unwrap_or_default();
            let message = xml_field(&text, "Message").unwrap_or_default();
            return Attempt::Fatal(self.status_error(None, status, &code, &message));
        }
        // Some servers answer throttling with 200 and an error document.
        if text.contains("<Error>") && !text.contains("<ListBucketResult") {
            return Attempt::Transient(format!(
                "error in a 200 response: {}",
                xml_field(&text, "Code").unwrap_or_default()
            ));
        }
        let parsed: ListBucketResult = match quick_xml::de::from_str(&text) {
            Ok(p) => p,
            Err(e) => {
                return Attempt::Fatal(TierError::BadSource {
                    url: self.url.clone(),
                    reason: format!("unreadable listing from the server: {e}"),
                })
            }
        };
        let encoded = parsed
            .encoding_type
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case("url"));
        let objects = parsed
            .contents
            .into_iter()
            .map(|c| {
                let key = if encoded {
                    decode_key(&c.key)
                } else {
                    Ok(c.key)
                };
                // Last-Modified (RFC 3339) becomes the view's mtime and ctime.
                let modified = c
                    .last_modified
                    .as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .and_then(|t| t.timestamp_nanos_opt());
                (key, c.size, c.e_tag.unwrap_or_default(), modified)
            })
            .collect();
        let next = if parsed.is_truncated {
            match parsed.next_continuation_token {
                Some(t) if !t.is_empty() => Some(t),
                _ => {
                    return Attempt::Fatal(TierError::BadSource {
                        url: self.url.clone(),
                        reason: "the server said the listing is truncated but gave no \
                                 continuation token"
                            .into(),
                    })
                }
            }
        } else {
            None
        };
        Attempt::Done(Page { objects, next })
    }

    /// One listing page, retried like every other request (see [`S3RetryConfig`]).
    async fn list_page(&self, token: Option<&str>) -> Result<Page, TierError> {
        let policy = &self.cfg.retry;
        let start = Instant::now();
        let init = policy.init_backoff_ms as f64 / 1000.0;
        let mut wait = init;
        let mut retries = 0;
        loop {
            match self.list_attempt(token).await {
                Attempt::Done(page) => return Ok(page),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Transient(reason) => {
                    if retries >= policy.max_retries
                        || start.elapsed() > Duration::from_millis(policy.retry_timeout_ms)
                    {
                        return Err(TierError::Unreachable {
                            url: self.url.clone(),
                            reason: format!(
                                "listing failed after {retries} retries in {:.1} s: {reason}",
                                start.elapsed().as_secs_f64()
                            ),
                        });
                    }
                    retries += 1;
                    // The same decorrelated jitter as object_store's requests.
                    let sleep = Duration::from_secs_f64(wait);
                    tracing::debug!(tier = %self.url, %reason, retries, ?sleep, "retrying listing page");
                    tokio::time::sleep(sleep).await;
                    let high = (wait * policy.backoff_base).max(init);
                    wait = (init + rand::random::<f64>() * (high - init))
                        .min(policy.max_backoff_ms as f64 / 1000.0);
                }
            }
        }
    }

    /// Lists every key under the prefix, page by page, handing each classified key to `visit`
    /// until it breaks. Returns whether the walk reached the end.
    async fn walk(
        &self,
        mut visit: impl FnMut(Item) -> ControlFlow<()>,
    ) -> Result<bool, TierError> {
        let mut token: Option<String> = None;
        let mut pages = 0u64;
        loop {
            let page = self.list_page(token.as_deref()).await?;
            pages += 1;
            for (key, size, etag, modified) in page.objects {
                if visit(self.classify(key, size, etag, modified)).is_break() {
                    return Ok(false);
                }
            }
            match page.next {
                Some(next) => {
                    if token.as_deref() == Some(next.as_str()) {
                        return Err(TierError::BadSource {
                            url: self.url.clone(),
                            reason: format!(
                                "the server repeated a continuation token after {pages} pages"
                            ),
                        });
                    }
                    token = Some(next);
                }
                None => {
                    tracing::debug!(tier = %self.url, pages, "listing complete");
                    return Ok(true);
                }
            }
        }
    }

    /// Fetches one piece (`range`, or the whole object) into `dest`, conditioned on `if_match`.
    /// Returns the ETag the server reported.
    async fn fetch_piece(
        &self,
        loc: &ObjPath,
        sample: &SampleRef,
        range: Option<Range<u64>>,
        if_match: Option<String>,
        dest: &Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<Option<String>, TierError> {
        let want = range.clone().unwrap_or(0..sample.size);
        if want.end > want.start {
            pacer.consume(want.end - want.start).await;
        }
        let _permit = self
            .requests
            .acquire()
            .await
            .expect("the request semaphore is never closed");
        let opts = GetOptions {
            if_match: if_match.clone(),
            range: range.clone().map(GetRange::Bounded),
            ..Default::default()
        };
        let res = match self.store.get_opts(loc, opts).await {
            Ok(r) => r,
            Err(object_store::Error::Precondition { .. }) => {
                return Err(self.changed_error(loc, sample).await)
            }
            Err(e) => return Err(self.store_error(Some(&sample.path), e)),
        };
        let found_etag = res.meta.e_tag.clone();
        let changed = |found: String| TierError::Changed {
            url: self.url.clone(),
            path: sample.path.clone(),
            expected: format!(
                "{} bytes, ETag {}",
                sample.size,
                if_match.as_deref().unwrap_or("(any)")
            ),
            found,
        };
        if res.meta.size != sample.size {
            return Err(changed(format!(
                "{} bytes, ETag {}",
                res.meta.size,
                found_etag.as_deref().unwrap_or("(none)")
            )));
        }
        if let Some(expected) = &if_match {
            // The server should have refused with 412; some S3-compatible stores ignore
            // If-Match, so check the ETag they report too.
            if found_etag.as_deref() != Some(expected.as_str()) {
                return Err(changed(format!(
                    "ETag {}",
                    found_etag.as_deref().unwrap_or("(none)")
                )));
            }
        }
        if res.range != want {
            return Err(TierError::Io {
                url: self.url.clone(),
                path: sample.path.clone(),
                source: std::io::Error::other(format!(
                    "asked for bytes {want:?}, the server sent {:?}",
                    res.range
                )),
            });
        }
        let mut stream = res.into_stream();
        let mut off = want.start;
        // Frames are kept as they arrive (reference-counted, not copied) and written together
        // with one vectored write once they add up to WRITE_BATCH.
        let mut batch: Vec<Bytes> = Vec::new();
        let mut batch_len = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.store_error(Some(&sample.path), e))?;
            if off + batch_len + chunk.len() as u64 > want.end {
                return Err(changed(format!("more than {} bytes", want.end)));
            }
            batch_len += chunk.len() as u64;
            batch.push(chunk);
            if batch_len >= WRITE_BATCH as u64 || batch.len() >= MAX_IOVECS {
                off = write_at(dest, std::mem::take(&mut batch), off, sample).await?;
                batch_len = 0;
            }
        }
        if !batch.is_empty() {
            off = write_at(dest, batch, off, sample).await?;
        }
        if off != want.end {
            return Err(TierError::Io {
                url: self.url.clone(),
                path: sample.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the response for bytes {want:?} ended after {} bytes",
                        off - want.start
                    ),
                ),
            });
        }
        Ok(found_etag)
    }

    /// The error for a failed `If-Match`: what the object is now, or that it is gone.
    async fn changed_error(&self, loc: &ObjPath, sample: &SampleRef) -> TierError {
        let expected = format!("{} bytes, ETag {}", sample.size, sample.version);
        match self.store.head(loc).await {
            Ok(meta) => TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected,
                found: format!(
                    "{} bytes, ETag {}",
                    meta.size,
                    meta.e_tag.as_deref().unwrap_or("(none)")
                ),
            },
            Err(object_store::Error::NotFound { .. }) => TierError::NotFound {
                url: self.url.clone(),
                path: sample.path.clone(),
            },
            Err(_) => TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected,
                found: "a different ETag".into(),
            },
        }
    }
}

/// Most buffers in one vectored write (well under the kernel's IOV_MAX of 1024).
const MAX_IOVECS: usize = 256;

/// Writes `bufs` back to back at `off` on a blocking thread, with as few `pwritev` calls as the
/// kernel allows (and starts their writeback when the copy is to be durable); returns the
/// offset after them.
async fn write_at(
    dest: &Arc<std::fs::File>,
    bufs: Vec<Bytes>,
    off: u64,
    sample: &SampleRef,
) -> Result<u64, TierError> {
    let file = dest.clone();
    let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let durable = sample.durable;
    tokio::task::spawn_blocking(move || {
        pwritev_all(&file, &bufs, off)?;
        if durable {
            crate::tier::start_writeback(&file, off, len);
        }
        Ok::<(), std::io::Error>(())
    })
    .await
    .expect("write task panicked")
    .map_err(|source| TierError::Local {
        path: sample.path.clone(),
        source,
    })?;
    Ok(off + len)
}

/// Writes every byte of `bufs`, in order, at `off`.
fn pwritev_all(file: &std::fs::File, bufs: &[Bytes], mut off: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // (buffer index, bytes of it already written)
    let (mut i, mut done) = (0usize, 0usize);
    loop {
        // Written and empty buffers need no write; a write of nothing would read as a failure.
        while i < bufs.len() && bufs[i].len() == done {
            i += 1;
            done = 0;
        }
        if i == bufs.len() {
            return Ok(());
        }
        let iov: Vec<libc::iovec> = bufs[i..]
            .iter()
            .take(MAX_IOVECS)
            .enumerate()
            .map(|(k, b)| {
                let skip = if k == 0 { done } else { 0 };
                libc::iovec {
                    iov_base: b[skip..].as_ptr() as *mut libc::c_void,
                    iov_len: b.len() - skip,
                }
            })
            .collect();
        // SAFETY: every iovec points into a buffer that `bufs` keeps alive for the call, and
        // the kernel only reads from them.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut n = n as usize;
        off += n as u64;
        while n > 0 {
            let left = bufs[i].len() - done;
            if n >= left {
                n -= left;
                i += 1;
                done = 0;
            } else {
                done += n;
                n = 0;
            }
        }
    }
}

/// Removes secrets from text meant for errors and logs: the configured secret values, and the
/// values of presigned-URL parameters that would let anyone repeat a request.
fn scrub_with(secrets: &[String], text: &str) -> String {
    let mut out = text.to_string();
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    for marker in [
        "X-Amz-Signature=",
        "X-Amz-Security-Token=",
        "X-Amz-Credential=",
    ] {
        let mut from = 0;
        while let Some(i) = out[from..].find(marker) {
            let start = from + i + marker.len();
            let end = out[start..]
                .find(['&', ' ', ')', '"', '\'', '>', '<'])
                .map_or(out.len(), |j| start + j);
            out.replace_range(start..end, "***");
            from = start + 3;
        }
    }
    out
}

/// Whether sample `id` of `catalog` has relative path `path`, without allocating.
fn catalog_path_is(catalog: &Catalog, id: u32, path: &str) -> bool {
    let (dir, name) = catalog.dir_and_name(id);
    if dir.is_empty() {
        name == path
    } else {
        path.len() == dir.len() + 1 + name.len()
            && path.starts_with(dir)
            && path.as_bytes()[dir.len()] == b'/'
            && path.ends_with(name)
    }
}

/// Whether `path` is a directory of some sample of `catalog` (binary search on the sorted
/// paths for the first one at or after `path/`).
fn catalog_has_dir(catalog: &Catalog, path: &str) -> bool {
    let dir = format!("{path}/");
    let (mut lo, mut hi) = (0usize, catalog.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if catalog.path(mid as u32) < dir {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo < catalog.len() && catalog.path(lo as u32).starts_with(&dir)
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

    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError> {
        let loc = self.locate(&sample.path)?;
        let piece = self.cfg.part_size.min(pacer.chunk_bytes()).max(1);
        let expected = (!sample.version.is_empty()).then(|| sample.version.clone());
        if sample.size <= piece {
            self.fetch_piece(&loc, sample, None, expected, &dest, pacer)
                .await?;
            return Ok(sample.size);
        }
        let mut ranges =
            (0..sample.size.div_ceil(piece)).map(|i| i * piece..((i + 1) * piece).min(sample.size));
        let etag = match expected {
            Some(e) => Some(e),
            None => {
                // No catalogued version: the first part's ETag pins the others, so the parts
                // cannot come from two versions of the object.
                let first = ranges.next().expect("a large object has parts");
                self.fetch_piece(&loc, sample, Some(first), None, &dest, pacer)
                    .await?
            }
        };
        futures::stream::iter(ranges)
            .map(|r| self.fetch_piece(&loc, sample, Some(r), etag.clone(), &dest, pacer))
            .buffer_unordered(self.cfg.max_parallel_parts)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        Ok(sample.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_writes_put_every_byte_in_place() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        // More buffers than one pwritev takes, empty ones among them, written at an offset.
        let bufs: Vec<Bytes> = (0..700u32)
            .map(|i| Bytes::from(vec![(i % 251) as u8; (i % 7) as usize * 3]))
            .collect();
        pwritev_all(&file, &bufs, 5).unwrap();
        let want: Vec<u8> = std::iter::repeat_n(0u8, 5)
            .chain(bufs.iter().flat_map(|b| b.iter().copied()))
            .collect();
        assert_eq!(std::fs::read(&path).unwrap(), want);
        // A batch of empty frames (a stream may end with one) writes nothing and succeeds.
        pwritev_all(&file, &[Bytes::new(), Bytes::new()], 1 << 20).unwrap();
        pwritev_all(&file, &[], 0).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse_s3_url("s3://b/x/y/").unwrap(),
            ("b".to_string(), "x/y".to_string())
        );
        assert_eq!(
            parse_s3_url("s3://b").unwrap(),
            ("b".to_string(), String::new())
        );
        assert!(parse_s3_url("s3://b/a/../c").is_err());
        assert!(parse_s3_url("http://b/c").is_err());
        let e = parse_s3_url("s3://AKID:SECRETSECRET@b/c").unwrap_err();
        assert!(!e.to_string().contains("SECRETSECRET"), "{e}");
    }

    #[test]
    fn keys_decode_like_s3() {
        assert_eq!(decode_key("a+b%2Bc%2Fd").unwrap(), "a b+c/d");
        assert_eq!(decode_key("%C3%A9").unwrap(), "é");
        assert!(decode_key("%FF").is_err());
    }

    #[test]
    fn scrubbing() {
        let s = scrub_with(
            &["topsecretvalue".to_string()],
            "GET http://h/b/?list-type=2&X-Amz-Credential=AK%2F1&X-Amz-Signature=abcdef x topsecretvalue",
        );
        assert!(!s.contains("abcdef") && !s.contains("topsecretvalue") && !s.contains("AK%2F1"));
        assert!(s.contains("list-type=2"), "{s}");
    }

    #[test]
    fn config_from_toml_like_json() {
        let c: S3Config = serde_json::from_str(
            r#"{"endpoint":"http://127.0.0.1:3900","part_size":"16MiB","secret_access_key":"s3cr3tvalue","access_key_id":"GK1"}"#,
        )
        .unwrap();
        assert_eq!(c.part_size, 16 << 20);
        assert!(!format!("{c:?}").contains("s3cr3tvalue"));
        assert!(!serde_json::to_string(&c).unwrap().contains("s3cr3tvalue"));
        assert!(serde_json::from_str::<S3Config>(r#"{"part_sise":1}"#).is_err());
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn resolution_order() {
        let e = env(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
            ("AWS_REGION", "from-env"),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "GKENV"),
            ("AWS_SECRET_ACCESS_KEY", "envsecretvalue"),
        ]);
        let t = S3Tier::with_env("s3://bkt/p", S3Config::default(), e.clone()).unwrap();
        assert_eq!(t.region(), "from-env");
        assert_eq!(t.endpoint(), "http://127.0.0.1:9");
        let cfg = S3Config {
            endpoint: Some("http://127.0.0.1:10".into()),
            region: Some("explicit".into()),
            access_key_id: Some("GKX".into()),
            secret_access_key: Some(Secret::new("explicitsecret")),
            ..Default::default()
        };
        let t = S3Tier::with_env("s3://bkt/p/", cfg, e).unwrap();
        assert_eq!(t.region(), "explicit");
        assert_eq!(t.endpoint(), "http://127.0.0.1:10");
        assert_eq!(t.url(), "s3://bkt/p");
        let dbg = format!("{t:?}");
        assert!(!dbg.contains("explicitsecret") && !dbg.contains("envsecretvalue"));
        // Plain HTTP needs consent.
        let err = S3Tier::with_env(
            "s3://bkt",
            S3Config {
                endpoint: Some("http://127.0.0.1:10".into()),
                ..Default::default()
            },
            Vec::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("allow_http"), "{err}");
    }

    #[test]
    fn classification() {
        let t = S3Tier::with_env(
            "s3://bkt/p",
            S3Config {
                endpoint: Some("http://127.0.0.1:10".into()),
                allow_http: Some(true),
                ..Default::default()
            },
            Vec::new(),
        )
        .unwrap();
        let skip = |k: &str| match t.classify(Ok(k.to_string()), 1, String::new(), None) {
            Item::Skip(key, why) => {
                assert_eq!(key, k);
                why
            }
            Item::Entry(e) => panic!("{k} accepted as {}", e.path),
        };
        assert!(skip("p/a/../b").contains("`..`"));
        assert!(skip("p//abs").contains("absolute"));
        assert!(skip("p/a//b").contains("empty path segment"));
        assert!(skip("p/a/./b").contains("`.`"));
        assert!(skip("p/dir/").contains("directory marker"));
        assert!(skip("p/").contains("directory marker"));
        assert!(skip("p/a\u{1}b").contains("control"));
        assert!(skip("pq/x").contains("outside"));
        match t.classify(Ok("p/a b/c+d".into()), 7, "\"e\"".into(), None) {
            Item::Entry(e) => {
                assert_eq!(
                    (e.path.as_str(), e.size, e.version.as_str()),
                    ("a b/c+d", 7, "\"e\"")
                )
            }
            Item::Skip(_, why) => panic!("{why}"),
        }
        assert!(matches!(t.locate("a/../b"), Err(TierError::Escapes { .. })));
        assert_eq!(t.locate("a b/c").unwrap().as_ref(), "p/a b/c");
    }

    #[test]
    fn catalog_helpers() {
        let cat = Catalog::from_entries(
            "x",
            ["a-b", "a/b", "a/c/d", "z"].map(|p| CatalogEntry::new(p, 1)),
        )
        .unwrap();
        assert!(catalog_path_is(&cat, 1, "a/b"));
        assert!(!catalog_path_is(&cat, 1, "a/c"));
        assert!(catalog_has_dir(&cat, "a"));
        assert!(catalog_has_dir(&cat, "a/c"));
        assert!(!catalog_has_dir(&cat, "a-b"));
        assert!(!catalog_has_dir(&cat, "z"));
    }
}
