//! The config loader: any TOML text gives a config or an error naming the file, and a parsed
//! config resolves (with no flags) to a mount config or an error naming the key, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metfs::config::{FileConfig, MountConfig};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match FileConfig::parse(text, "fuzz.toml") {
            Ok(file) => {
                let _ =
                    MountConfig::resolve(file, FileConfig::default()).map_err(|e| e.to_string());
            }
            Err(e) => assert!(
                e.to_string().contains("fuzz.toml"),
                "error does not name the file: {e}"
            ),
        }
    }
});
