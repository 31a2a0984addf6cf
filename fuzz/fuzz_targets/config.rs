//! The config loader: any TOML text gives a config or an error naming the file or the key
//! (with the file), never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metfs::config::{ConfigError, Layers, MountConfig};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match Layers::new().toml(text, "fuzz.toml") {
            Ok(layers) => {
                let _ = MountConfig::resolve(&layers).map_err(|e| e.to_string());
            }
            Err(e @ (ConfigError::Parse { .. } | ConfigError::Unknown { .. })) => assert!(
                e.to_string().contains("fuzz.toml"),
                "error does not name the file: {e}"
            ),
            Err(e) => panic!("unexpected error reading a file: {e}"),
        }
    }
});
