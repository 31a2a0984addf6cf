//! The control socket's request parser: any line a client sends must give a request or a
//! protocol error, never a panic; an error must render as a response object.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The socket answers non-UTF-8 lines itself before parsing (control.rs).
    if let Ok(line) = std::str::from_utf8(data) {
        match metfs_protocol::parse_request(line) {
            Ok(req) => {
                let _ = format!("{req:?}");
            }
            Err(e) => {
                let r = e.to_reply();
                assert!(!r.ok, "an error reply says ok: false");
                assert!(!r.error.message.is_empty(), "an error reply says why");
            }
        }
    }
});
