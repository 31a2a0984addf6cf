//! [`Check`]: a bad value of a setting turned into an error naming the setting and where its
//! value came from. Every concern's checks (`resolve`, `mode`, `samples`) take one.

use super::{ConfigError, Layers};

/// Turns a bad value into an error naming its setting and its origin.
pub(super) struct Check<'a> {
    layers: &'a Layers,
}

impl<'a> Check<'a> {
    /// The checks of settings read from `layers`.
    pub(super) fn new(layers: &'a Layers) -> Self {
        Self { layers }
    }

    /// The error for setting `key`'s value.
    pub(super) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            key: key.to_string(),
            origin: self.layers.origin(key),
            message: message.into(),
        }
    }
}
