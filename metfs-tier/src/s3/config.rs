//! The S3 tier's settings: [`S3Config`] (endpoint, region, credentials, part size,
//! parallelism, timeouts) and [`S3RetryConfig`], as read from the config file, and [`Secret`],
//! the string type that keeps credentials out of `Debug` output and serialization.

use std::time::Duration;

use object_store::{BackoffConfig, RetryConfig};
use serde::{Deserialize, Deserializer, Serialize};

use metfs_plan::size::parse_size;

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
///
/// With the `clap` feature, `endpoint`, `region`, `allow_http` and `virtual_hosted_style` are
/// also the flags `--endpoint`, `--region`, `--allow-http` and `--virtual-hosted-style` (their
/// ids are the keys' dotted paths); the other keys are read from the file only (credentials
/// never belong on a command line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL, e.g. `http://127.0.0.1:3900` (Garage) or `https://s3.example.org` (MinIO,
    /// Ceph RGW); `AWS_ENDPOINT_URL_S3` and `AWS_ENDPOINT` are read too
    /// [default: $AWS_ENDPOINT_URL, else AWS's endpoint for the region].
    #[cfg_attr(feature = "clap", arg(id = "s3.endpoint", long = "endpoint"))]
    pub endpoint: Option<String>,
    /// Signing region. Must equal the server's region (Garage: `s3_region` in garage.toml,
    /// MinIO: `us-east-1` unless configured), or requests fail with 400; `AWS_DEFAULT_REGION` is
    /// read too [default: $AWS_REGION, else us-east-1].
    #[cfg_attr(feature = "clap", arg(id = "s3.region", long = "region"))]
    pub region: Option<String>,
    /// Allow plain `http://` endpoints: off by default because data and requests would cross
    /// the network in clear text; a loopback test server needs it [default: $AWS_ALLOW_HTTP,
    /// else false].
    #[cfg_attr(feature = "clap", arg(id = "s3.allow_http", long = "allow-http",
        num_args = 0..=1, require_equals = true, default_missing_value = "true"))]
    pub allow_http: Option<bool>,
    /// Address the bucket as `https://BUCKET.endpoint/KEY` instead of `https://endpoint/BUCKET/KEY`.
    /// Off by default (path style), which every S3-compatible store accepts without DNS set-up;
    /// AWS accepts both. With it and an explicit endpoint, the endpoint must already contain the
    /// bucket name [default: $AWS_VIRTUAL_HOSTED_STYLE_REQUEST, else false].
    #[cfg_attr(feature = "clap", arg(id = "s3.virtual_hosted_style",
        long = "virtual-hosted-style", num_args = 0..=1, require_equals = true,
        default_missing_value = "true"))]
    pub virtual_hosted_style: Option<bool>,
    /// Access key id. Default: `AWS_ACCESS_KEY_ID`, else the instance / container credential
    /// chain. Setting it here (with the secret) ignores the credentials in the environment.
    #[cfg_attr(feature = "clap", arg(skip))]
    pub access_key_id: Option<String>,
    /// Secret access key, given together with `access_key_id`. Prefer `AWS_SECRET_ACCESS_KEY` in
    /// the environment to a configuration file. Never serialized, never shown.
    #[serde(skip_serializing)]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub secret_access_key: Option<Secret>,
    /// Session token of temporary credentials. Default: `AWS_SESSION_TOKEN` (only when the key
    /// comes from the environment too). Never serialized, never shown.
    #[serde(skip_serializing)]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub session_token: Option<Secret>,
    /// Size of one ranged GET for objects larger than this (`8MiB` or a byte count), capped at
    /// the pacer's chunk (8 MiB, or 256 KiB under a bandwidth cap). Default 8 MiB: large enough
    /// that per-request latency is amortized (AWS recommends 8–16 MiB ranges), small enough
    /// that a 64 MiB object is read by 8 requests in parallel.
    #[serde(deserialize_with = "de_size")]
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().part_size))]
    pub part_size: u64,
    /// Ranged GETs in flight for one object. Default 8: one TCP stream rarely fills a fast link,
    /// a handful do.
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().max_parallel_parts))]
    pub max_parallel_parts: usize,
    /// Requests in flight for the whole tier, across all fetches. Default 64: above the
    /// stager's 32 concurrent samples so that large objects can add parallel parts, and the
    /// HTTP pool keeps that many connections open per host.
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().max_requests))]
    pub max_requests: usize,
    /// Retry policy, see [`S3RetryConfig`].
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().retry))]
    pub retry: S3RetryConfig,
    /// TCP connect timeout in milliseconds. Default 5000 (as `object_store`): a reachable
    /// endpoint answers in far less, an unreachable one should be retried soon.
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().connect_timeout_ms))]
    pub connect_timeout_ms: u64,
    /// Timeout of one whole request, body included, in milliseconds. Default 30000: one piece
    /// (8 MiB) needs about 2 MB/s to finish in time; a slower link needs a larger value or a
    /// smaller `part_size`. A timed-out request is retried.
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().request_timeout_ms))]
    pub request_timeout_ms: u64,
    /// Idle connections are closed after this many milliseconds. Default 15000: shorter than the
    /// 20 s after which S3 and most servers drop idle connections, so the client rarely reuses a
    /// connection the server is closing.
    #[cfg_attr(feature = "clap", arg(skip = S3Config::default().pool_idle_timeout_ms))]
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

pub(super) fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
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
