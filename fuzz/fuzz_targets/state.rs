//! The daemon's saved position (`state.json`): any content is refused with an error naming the
//! bad field, or gives a position inside the limits the daemon relies on, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metfs::daemon::{SavedFingerprint, SavedState};

fuzz_target!(|data: &[u8]| {
    match SavedState::from_json(data) {
        Ok(s) => {
            assert!(s.generation >= 1, "generation 0 accepted");
            assert!(s.fingerprint != SavedFingerprint::Legacy(String::new()));
            for nm in [1, 4, u32::MAX] {
                let _ = s.check_plan(nm).map_err(|e| e.to_string());
            }
        }
        Err(e) => assert!(
            e.to_string().contains("state.json"),
            "error does not name the file: {e}"
        ),
    }
});
