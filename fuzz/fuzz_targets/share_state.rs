//! A shared mount's save file (`share.json`): any content is refused with an error naming the
//! file, or gives jobs whose names, tokens, generations and positions are inside the limits
//! the daemon relies on, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metfs::daemon::{SavedShare, GENERATION_LIMIT};

fuzz_target!(|data: &[u8]| {
    match SavedShare::from_json(data) {
        Ok(s) => {
            assert!((2..GENERATION_LIMIT).contains(&s.generation));
            for j in &s.jobs {
                assert!((2..GENERATION_LIMIT).contains(&j.generation));
                assert!(metfs::daemon::check_job_name(&j.name).is_ok());
                assert!(j.cohort.current.as_ref().is_some_and(|v| v.epoch == j.epoch));
                let _ = (j.slot(), j.next_slot());
            }
        }
        Err(e) => assert!(
            e.to_string().contains("share.json"),
            "error does not name the file: {e}"
        ),
    }
});
