//! The `[control]` settings: the control socket's limits (`--control-*` flags). They live with
//! the other settings, not with the socket (`crate::control`), so that the configuration
//! depends on nothing of the daemon it configures.

use serde::{Deserialize, Serialize};

/// Limits of the control socket (`[control]` in the config file, `--control-*` flags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    /// Control-socket connections served at once; one more is answered with a
    /// `too_many_connections` error line and closed. 1024: every rank of a large node plus
    /// tools, with room, and well under the daemon's descriptor limit.
    #[arg(id = "control.max_connections", long = "control-max-connections",
        default_value_t = ControlConfig::default().max_connections)]
    pub max_connections: usize,
    /// Seconds a control connection may wait between request lines before it is closed
    /// (clients reconnect; time spent answering a blocking request does not count). 600:
    /// longer than clients' gaps between requests in practice, short enough that abandoned
    /// connections do not pile up.
    #[arg(id = "control.idle_timeout_secs", long = "control-idle-timeout-secs",
        default_value_t = ControlConfig::default().idle_timeout_secs)]
    pub idle_timeout_secs: u64,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            idle_timeout_secs: 600,
        }
    }
}
