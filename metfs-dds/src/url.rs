//! Where a queue lives: `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (or `etcds://` for TLS), and
//! the connection options etcd users expect (`etcdctl`'s `--cacert`, `--cert`, `--key`,
//! `--user`), turned into one checked [`etcd_client::Client`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::DdsError;

/// A parsed queue address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdsUrl {
    /// `host:port` of each etcd member.
    pub endpoints: Vec<String>,
    /// Key prefix of the queue, without leading or trailing `/`.
    pub prefix: String,
    /// `etcds://`: talk TLS.
    pub tls: bool,
}

impl DdsUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (`etcds://` for TLS). The prefix is
    /// required, so that two jobs never share the root of an etcd by accident.
    pub fn parse(url: &str) -> Result<Self, DdsError> {
        let bad = |reason: &str| DdsError::BadUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else {
            return Err(bad(
                "expected etcd://HOST:PORT/PREFIX or etcds://HOST:PORT/PREFIX",
            ));
        };
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /PREFIX after the endpoints"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(bad("the PREFIX after the endpoints is empty"));
        }
        if prefix
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(bad("the PREFIX has an empty, '.' or '..' component"));
        }
        if prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("the PREFIX has a space or control character"));
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("endpoint {h:?} has no :PORT")))?;
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("endpoint {h:?} is not HOST:PORT")));
            }
            endpoints.push(h.to_string());
        }
        Ok(Self {
            endpoints,
            prefix: prefix.to_string(),
            tls,
        })
    }
}

impl fmt::Display for DdsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        write!(f, "{scheme}://{}/{}", self.endpoints.join(","), self.prefix)
    }
}

/// How to authenticate to etcd; each field mirrors an `etcdctl` flag and its `ETCDCTL_*`
/// environment variable.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// `--cacert`: CA bundle that signed the server certificates (turns TLS on).
    pub cacert: Option<PathBuf>,
    /// `--cert`: client certificate for mutual TLS (with `key`).
    pub cert: Option<PathBuf>,
    /// `--key`: the client certificate's private key.
    pub key: Option<PathBuf>,
    /// `--user NAME[:PASSWORD]`; the password may instead come from `password`.
    pub user: Option<String>,
    /// `--password` (for a user name without `:PASSWORD`).
    pub password: Option<String>,
    /// Timeout of each request; an unreachable etcd fails after this long.
    pub timeout: Duration,
}

impl EtcdOptions {
    /// The default request timeout: long enough for an fsync on a loaded disk, short enough
    /// that an unreachable etcd is reported promptly.
    pub const TIMEOUT: Duration = Duration::from_secs(5);
    /// How often an idle connection is pinged to find a dead etcd. etcd refuses pings closer
    /// than its `--grpc-keepalive-min-time` (5 s by default): past a few, it sends GOAWAY
    /// (`too_many_pings`) and every stream on the connection, the queue's watch included, ends
    /// with an h2 protocol error. 10 s, gRPC's own floor for clients, stays clear of it.
    pub const KEEP_ALIVE: Duration = Duration::from_secs(10);
}

fn read(path: &PathBuf) -> Result<Vec<u8>, DdsError> {
    std::fs::read(path).map_err(|source| DdsError::File {
        path: path.clone(),
        source,
    })
}

/// Connects to the etcd of `url` and checks that it answers (etcd-client connects lazily,
/// and a first request that fails deep inside a claim would say much less).
pub async fn connect(url: &DdsUrl, opts: &EtcdOptions) -> Result<Client, DdsError> {
    let timeout = if opts.timeout.is_zero() {
        EtcdOptions::TIMEOUT
    } else {
        opts.timeout
    };
    let mut co = ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout)
        .with_keep_alive(EtcdOptions::KEEP_ALIVE, timeout);
    let tls = url.tls || opts.cacert.is_some() || opts.cert.is_some();
    if tls {
        let mut t = TlsOptions::new();
        if let Some(ca) = &opts.cacert {
            t = t.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        match (&opts.cert, &opts.key) {
            (Some(c), Some(k)) => t = t.identity(Identity::from_pem(read(c)?, read(k)?)),
            (None, None) => {}
            _ => {
                return Err(DdsError::BadUrl {
                    url: url.to_string(),
                    reason: "--etcd-cert and --etcd-key go together".into(),
                })
            }
        }
        co = co.with_tls(t);
    }
    if let Some(user) = &opts.user {
        let (name, pw) = match user.split_once(':') {
            Some((n, p)) => (n.to_string(), p.to_string()),
            None => (user.clone(), opts.password.clone().unwrap_or_default()),
        };
        co = co.with_user(name, pw);
    }
    let scheme = if tls { "https" } else { "http" };
    let endpoints: Vec<String> = url
        .endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}"))
        .collect();
    let unreachable = |e: etcd_client::Error| DdsError::Unreachable {
        url: url.to_string(),
        reason: e.to_string(),
    };
    // With a user, connect() authenticates and so already talks to etcd.
    let connecting = Client::connect(&endpoints, Some(co));
    let mut client = tokio::time::timeout(timeout * 2, connecting)
        .await
        .map_err(|_| DdsError::Unreachable {
            url: url.to_string(),
            reason: format!("no answer within {:?}", timeout * 2),
        })?
        .map_err(unreachable)?;
    tokio::time::timeout(timeout * 2, client.status())
        .await
        .map_err(|_| DdsError::Unreachable {
            url: url.to_string(),
            reason: format!("no answer within {:?}", timeout * 2),
        })?
        .map_err(unreachable)?;
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints_and_prefix() {
        let u = DdsUrl::parse("etcd://n1:2379,n2:2379/jobs/42/").unwrap();
        assert_eq!(u.endpoints, ["n1:2379", "n2:2379"]);
        assert_eq!(u.prefix, "jobs/42");
        assert!(!u.tls);
        assert_eq!(u.to_string(), "etcd://n1:2379,n2:2379/jobs/42");
        assert!(DdsUrl::parse("etcds://h:1/p").unwrap().tls);
    }

    #[test]
    fn refuses_bad_addresses_naming_them() {
        for bad in [
            "http://h:1/p",
            "etcd://h:1",
            "etcd://h:1/",
            "etcd://h/p",
            "etcd://h:0/p",
            "etcd://h:99999/p",
            "etcd://h:1/a/../b",
            "etcd://h:1/a b",
        ] {
            let e = DdsUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
