//! The listing: `ListObjectsV2` sent by hand (presigned by `object_store`, `encoding-type=url`,
//! retried like the reads; see the module docs for why not `ObjectStore::list`), each key
//! classified into a catalog entry or a skipped key with its reason, one page at a time.

use std::ops::ControlFlow;
use std::time::Duration;

use object_store::client::{HttpErrorKind, HttpRequestBody};
use object_store::path::Path as ObjPath;
use object_store::signer::{SignedUrlOptions, Signer};
use serde::Deserialize;

use crate::backoff::Backoff;
use crate::catalog::{validate_rel_path, Catalog, CatalogEntry, Meta};
use crate::TierError;

use super::errors::{chain_text, xml_field, Attempt};
use super::S3Tier;

/// How long a presigned listing URL stays valid. A page is requested right after signing, so
/// this only has to cover clock skew and one slow request.
pub(super) const LIST_URL_TTL: Duration = Duration::from_secs(15 * 60);

/// One listed key, classified.
pub(super) enum Item {
    /// A servable sample.
    Entry(CatalogEntry),
    /// A key left out, with why.
    Skip(String, String),
}

/// One listed object: key (decoded, or the lossy form when not UTF-8), size, ETag and
/// Last-Modified in nanoseconds.
pub(super) type Listed = (Result<String, String>, u64, String, Option<i64>);

/// One page of `ListObjectsV2`.
pub(super) struct Page {
    /// The objects in listing order.
    pub(super) objects: Vec<Listed>,
    /// Continuation token when more pages follow.
    pub(super) next: Option<String>,
}

/// Decodes a key of a `encoding-type=url` listing. S3 encodes a space as `+` (and `+` as
/// `%2B`), as botocore's decoder assumes.
pub(super) fn decode_key(raw: &str) -> Result<String, String> {
    let plus = raw.replace('+', " ");
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(&plus).collect();
    String::from_utf8(bytes).map_err(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListBucketResult {
    #[serde(default)]
    pub(super) contents: Vec<ListContent>,
    #[serde(default)]
    pub(super) is_truncated: bool,
    #[serde(default)]
    pub(super) next_continuation_token: Option<String>,
    #[serde(default)]
    pub(super) encoding_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListContent {
    pub(super) key: String,
    #[serde(default)]
    pub(super) size: u64,
    #[serde(rename = "ETag", default)]
    pub(super) e_tag: Option<String>,
    #[serde(default)]
    pub(super) last_modified: Option<String>,
}

impl S3Tier {
    /// Classifies one listed key.
    pub(super) fn classify(
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
    pub(super) async fn list_attempt(&self, token: Option<&str>) -> Attempt<Page> {
        match self.list_response(token).await {
            Attempt::Done((status, body)) => self.parse_page(status, &body),
            Attempt::Fatal(e) => Attempt::Fatal(e),
            Attempt::Transient(reason) => Attempt::Transient(reason),
        }
    }

    /// The listing request for the page after `token`, signed and sent: the status and the
    /// body of its answer.
    async fn list_response(&self, token: Option<&str>) -> Attempt<(u16, bytes::Bytes)> {
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
        Attempt::Done((status, body))
    }

    /// The page in a listing answer of HTTP `status`, or what went wrong.
    fn parse_page(&self, status: u16, body: &[u8]) -> Attempt<Page> {
        let text = String::from_utf8_lossy(body);
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

    /// One listing page, retried like every other request (see [`S3RetryConfig`]): with
    /// `object_store`'s decorrelated jitter, giving up after `max_retries` retries or once
    /// `retry_timeout_ms` has passed since the first attempt.
    pub(super) async fn list_page(&self, token: Option<&str>) -> Result<Page, TierError> {
        let policy = &self.cfg.retry;
        let mut backoff = Backoff::decorrelated(
            Duration::from_millis(policy.init_backoff_ms),
            policy.backoff_base,
            Duration::from_millis(policy.max_backoff_ms),
        )
        .max_retries(policy.max_retries)
        .give_up_after(Duration::from_millis(policy.retry_timeout_ms));
        loop {
            match self.list_attempt(token).await {
                Attempt::Done(page) => return Ok(page),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Transient(reason) => {
                    let Some(sleep) = backoff.next_wait() else {
                        return Err(TierError::Unreachable {
                            url: self.url.clone(),
                            reason: format!(
                                "listing failed after {} retries in {:.1} s: {reason}",
                                backoff.retries(),
                                backoff.elapsed().as_secs_f64()
                            ),
                        });
                    };
                    let retries = backoff.retries();
                    tracing::debug!(tier = %self.url, %reason, retries, ?sleep, "retrying listing page");
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }

    /// Lists every key under the prefix, page by page, handing each classified key to `visit`
    /// until it breaks. Returns whether the walk reached the end.
    pub(super) async fn walk(
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
}

/// Whether sample `id` of `catalog` has relative path `path`, without allocating.
pub(super) fn catalog_path_is(catalog: &Catalog, id: u32, path: &str) -> bool {
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
pub(super) fn catalog_has_dir(catalog: &Catalog, path: &str) -> bool {
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
