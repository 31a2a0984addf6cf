//! Turning what the server and the HTTP stack say into [`TierError`]s: status codes and S3
//! error codes, transport failures (transient or not), and the scrubber every error text
//! passes through so that secret keys, session tokens and presigned signatures never reach an
//! error or a log.

use object_store::client::HttpErrorKind;

use crate::TierError;

use super::S3Tier;

/// The result of one attempt at a request: done, failed for good, or worth retrying.
pub(super) enum Attempt<T> {
    Done(T),
    Fatal(TierError),
    Transient(String),
}

/// Text between `<tag>` and `</tag>` in an S3 XML error body (or error text quoting one), with
/// XML's predefined entities resolved.
pub(super) fn xml_field(text: &str, tag: &str) -> Option<String> {
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
pub(super) fn quoted_status(text: &str) -> Option<u16> {
    let i = text.find("status code: ")? + "status code: ".len();
    text.get(i..i + 3)?.parse().ok()
}

/// The whole `source()` chain of an error as one line.
pub(super) fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
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
pub(super) fn transport_kind(e: &(dyn std::error::Error + 'static)) -> Option<HttpErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<object_store::client::HttpError>() {
            return Some(h.kind());
        }
        cur = err.source();
    }
    None
}

impl S3Tier {
    pub(super) fn scrub(&self, s: &str) -> String {
        scrub_with(&self.redact, s)
    }

    /// Maps an HTTP error status and S3 error code to a tier error. `key` is the relative path
    /// for object requests, `None` for the listing.
    pub(super) fn status_error(
        &self,
        key: Option<&str>,
        status: u16,
        code: &str,
        message: &str,
    ) -> TierError {
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
    pub(super) fn store_error(&self, key: Option<&str>, e: object_store::Error) -> TierError {
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
}

/// Removes secrets from text meant for errors and logs: the configured secret values, and the
/// values of presigned-URL parameters that would let anyone repeat a request.
pub(super) fn scrub_with(secrets: &[String], text: &str) -> String {
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
