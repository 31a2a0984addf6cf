//! A sample's copy as it is written: how its file is created, and which tier errors are the
//! sample's own (it is gone, changed, unservable) rather than the tier's for now. The staging
//! of a slot (`stage.rs`), of a group of small samples (`group.rs`) and the continuation of a
//! cut copy (`partial.rs`) all write copies by these rules, so each has one owner here.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use metfs_tier::TierError;

use super::Landing;

/// Whether a tier error is about the sample itself (it is gone, changed, unservable), as
/// opposed to the tier being unavailable for now.
pub(super) fn is_samples_own(e: &TierError) -> bool {
    match e {
        TierError::NotFound { .. }
        | TierError::Changed { .. }
        | TierError::Escapes { .. }
        | TierError::NotRegular { .. } => true,
        // Refused access, a symlink loop, a directory or a too-long name in the sample's place
        // stay so however often it is retried. Anything else (EIO, ESTALE, ENOTCONN, errors
        // without an errno such as an S3 connection reset) may pass.
        TierError::Io { source, .. } => matches!(
            source.raw_os_error(),
            Some(libc::EACCES)
                | Some(libc::EPERM)
                | Some(libc::ELOOP)
                | Some(libc::EISDIR)
                | Some(libc::ENAMETOOLONG)
        ),
        _ => false,
    }
}

/// Creates the file a fetch writes `path`: owner-only while written, read-only once complete
/// (see the module docs), and readable, since the copy's CRC is read back through it. A file
/// already at a slot path ([`Landing::InPlace`]) is what an interrupted attempt left (never
/// journaled, or found wanting by the resume check) or a link to another slot's copy: it is
/// unlinked, never opened, so no other slot's copy is ever written through it.
pub(super) fn create_copy(path: &Path, landing: Landing) -> std::io::Result<std::fs::File> {
    let create = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
    };
    match create() {
        Err(e) if landing == Landing::InPlace && e.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            create()
        }
        r => r,
    }
}
