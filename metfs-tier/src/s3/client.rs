//! Opening an S3 tier: parsing `s3://BUCKET/PREFIX`, resolving the config over the `AWS_*`
//! environment, building the `object_store` client and the listing's HTTP client, and the
//! accessors and key mapping (a relative path is `PREFIX/path`, refused when it could escape
//! the view).

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::HttpConnector;
use object_store::path::Path as ObjPath;
use object_store::{ClientConfigKey, ClientOptions};
use tokio::sync::Semaphore;

use crate::catalog::validate_rel_path;
use crate::TierError;

use super::config::S3Config;
use super::errors::scrub_with;
use super::S3Tier;

/// Splits `s3://bucket/prefix` into a bucket and a clean prefix (no leading or trailing `/`).
pub(super) fn parse_s3_url(url: &str) -> Result<(String, String), TierError> {
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

pub(super) fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on" | "y"
    )
}

/// Refuses settings no tier can work with: a zero size, count or timeout, or half a pair of
/// credentials.
fn check_settings(cfg: &S3Config) -> Result<(), String> {
    if cfg.part_size == 0 || cfg.max_parallel_parts == 0 || cfg.max_requests == 0 {
        return Err("part_size, max_parallel_parts and max_requests must be at least 1".into());
    }
    if cfg.connect_timeout_ms == 0 || cfg.request_timeout_ms == 0 {
        return Err("timeouts must be positive".into());
    }
    if cfg.access_key_id.is_some() != cfg.secret_access_key.is_some() {
        return Err("access_key_id and secret_access_key must be given together".into());
    }
    Ok(())
}

/// The HTTP client's options from `cfg`: timeouts, the pool, metfs's user agent.
fn client_options(cfg: &S3Config) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
        .with_timeout(Duration::from_millis(cfg.request_timeout_ms))
        .with_pool_max_idle_per_host(cfg.max_requests)
        .with_pool_idle_timeout(Duration::from_millis(cfg.pool_idle_timeout_ms))
        .with_user_agent(object_store::HeaderValue::from_static(concat!(
            "metfs/",
            env!("CARGO_PKG_VERSION")
        )))
}

/// The `AWS_*` variables of `env`: the HTTP client's go into `opts`, the S3 client's are
/// returned (less the bucket, which the URL names, and the environment's credentials when
/// `explicit_creds`); anonymous access is refused.
fn split_env(
    env: impl IntoIterator<Item = (String, String)>,
    explicit_creds: bool,
    opts: &mut ClientOptions,
) -> Result<Vec<(AmazonS3ConfigKey, String)>, String> {
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
                return Err("anonymous access (AWS_SKIP_SIGNATURE) is not supported: \
                                    the listing is signed; give credentials"
                    .into());
            }
            AmazonS3ConfigKey::Client(ck) => *opts = opts.clone().with_config(ck, value),
            key => env_keys.push((key, value)),
        }
    }
    Ok(env_keys)
}

/// The S3 client's builder: the environment's settings, then `cfg`'s over them.
fn s3_builder(
    cfg: &S3Config,
    bucket: &str,
    env_keys: Vec<(AmazonS3ConfigKey, String)>,
    opts: &ClientOptions,
) -> AmazonS3Builder {
    let mut builder = AmazonS3Builder::new();
    for (key, value) in env_keys {
        builder = builder.with_config(key, value);
    }
    builder = builder
        .with_bucket_name(bucket)
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
    builder
}

/// Refuses an endpoint URL that carries credentials, or is plain HTTP unless allowed.
fn check_endpoint(ep: &str, allow_http: bool) -> Result<(), String> {
    if ep.contains('@') {
        return Err(
            "the endpoint URL must not carry credentials; use AWS_ACCESS_KEY_ID / \
             AWS_SECRET_ACCESS_KEY"
                .into(),
        );
    }
    if ep.starts_with("http://") && !allow_http {
        return Err(format!(
            "endpoint {ep} is plain HTTP: set allow_http = true (or AWS_ALLOW_HTTP=true) \
             to allow unencrypted requests"
        ));
    }
    Ok(())
}

impl S3Tier {
    /// Opens `url` (`s3://BUCKET` or `s3://BUCKET/PREFIX`) with `cfg`, falling back to the
    /// process environment for what `cfg` leaves unset. No request is sent: a wrong bucket or
    /// wrong credentials show at the first [`CapacityTier::list`](crate::CapacityTier::list).
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
        check_settings(&cfg).map_err(bad)?;
        let explicit_creds = cfg.access_key_id.is_some() || cfg.secret_access_key.is_some();
        let mut opts = client_options(&cfg);
        let env_keys = split_env(env, explicit_creds, &mut opts).map_err(bad)?;
        if let Some(h) = cfg.allow_http {
            opts = opts.with_allow_http(h);
        }
        let builder = s3_builder(&cfg, &bucket, env_keys, &opts);
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
            check_endpoint(ep, allow_http).map_err(bad)?;
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
}

impl S3Tier {
    /// The `object_store` path of relative path `rel`, refusing paths that could escape the
    /// view or that `object_store` would rewrite.
    pub(super) fn locate(&self, rel: &str) -> Result<ObjPath, TierError> {
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
}
