//! Tests of the POSIX tier.

use super::*;
use crate::SMALL_FILE_BYTES;

fn setup() -> (tempfile::TempDir, PosixTier) {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("a/b/x.bin"), vec![7u8; 10_000]).unwrap();
    std::fs::write(src.join("top file é"), b"hello").unwrap();
    std::fs::write(src.join("empty"), b"").unwrap();
    std::fs::write(d.path().join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), src.join("leak")).unwrap();
    std::os::unix::fs::symlink(src.join("top file é"), src.join("alias")).unwrap();
    let t = PosixTier::new(&src).unwrap();
    (d, t)
}

#[tokio::test]
async fn a_group_copies_each_sample_and_hashes_what_it_wrote() {
    let (d, t) = setup();
    let big = vec![3u8; SMALL_FILE_BYTES as usize + 10];
    std::fs::write(d.path().join("src/big"), &big).unwrap();
    let l = t.list().await.unwrap();
    let entry = |p: &str| l.entries.iter().find(|e| e.path == p).unwrap().clone();
    let want = ["a/b/x.bin", "top file é", "empty", "big", "gone"];
    std::fs::write(d.path().join("src/gone"), b"soon gone").unwrap();
    let l2 = t.list().await.unwrap();
    let gone = l2
        .entries
        .iter()
        .find(|e| e.path == "gone")
        .unwrap()
        .clone();
    std::fs::remove_file(d.path().join("src/gone")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let group: Vec<GroupMember> = want
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let e = if *p == "gone" { gone.clone() } else { entry(p) };
            let path = out.path().join(i.to_string());
            GroupMember {
                sample: SampleRef {
                    path: e.path,
                    size: e.size,
                    version: e.version,
                    durable: false,
                },
                open: Box::new(move || std::fs::File::create(path)),
                finish: Box::new(|f: &std::fs::File| {
                    use std::os::unix::fs::PermissionsExt;
                    f.set_permissions(std::fs::Permissions::from_mode(0o400))
                }),
            }
        })
        .collect();
    let copied = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r = t
        .fetch_group(group, &Pacer::unlimited(), copied.clone())
        .await;
    assert_eq!(copied.load(std::sync::atomic::Ordering::Relaxed), 5);
    for (i, p) in want.iter().enumerate().take(4) {
        let bytes = std::fs::read(out.path().join(i.to_string())).unwrap();
        assert_eq!(bytes, std::fs::read(d.path().join("src").join(p)).unwrap());
        let c = r[i].as_ref().unwrap();
        assert_eq!(c.bytes, bytes.len() as u64);
        // A large file is copied in the kernel: its bytes are never seen, so not hashed.
        let crc = (*p != "big").then(|| crc32fast::hash(&bytes));
        assert_eq!(c.crc, crc, "{p}");
        // Finished (made read-only) once complete.
        let md = std::fs::metadata(out.path().join(i.to_string())).unwrap();
        assert_eq!(md.mode() & 0o777, 0o400, "{p}");
    }
    // A copy that failed is not finished.
    let md = std::fs::metadata(out.path().join("4")).unwrap();
    assert_ne!(md.mode() & 0o777, 0o400);
    assert!(
        matches!(r[4], Err(TierError::NotFound { .. })),
        "{:?}",
        r[4]
    );
    assert_eq!(t.group_files(), POSIX_GROUP_FILES);
}

#[tokio::test]
async fn lists_and_skips_escaping_symlinks() {
    let (_d, t) = setup();
    let l = t.list().await.unwrap();
    let mut paths: Vec<_> = l.entries.iter().map(|e| e.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, vec!["a/b/x.bin", "alias", "empty", "top file é"]);
    assert!(l
        .skipped
        .iter()
        .any(|(p, why)| p == "leak" && why.contains("outside")));
}

/// The catalog listed straight into a builder is the one built from the listing, entry
/// for entry (paths, sizes, versions, owners and modes, directory stamps), and it leaves
/// out what the listing leaves out, with the same reasons.
#[tokio::test]
async fn a_catalog_listed_straight_into_the_builder_is_the_one_from_the_listing() {
    let (d, t) = setup();
    let src = d.path().join("src");
    for i in 0..50 {
        std::fs::create_dir_all(src.join(format!("c{}", i % 7))).unwrap();
        std::fs::write(src.join(format!("c{}/f{i}", i % 7)), vec![1u8; i]).unwrap();
    }
    std::os::unix::fs::symlink(&src, src.join("a/loop")).unwrap();
    let l = t.list().await.unwrap();
    let mut from_list = Catalog::from_entries(t.url(), l.entries).unwrap();
    from_list.set_dir_stamps(l.dir_stamps);
    let streamed = t.catalog().await.unwrap();
    assert_eq!(streamed.catalog.len(), 54);
    assert_eq!(streamed.catalog, from_list);
    assert_eq!(streamed.skipped, l.skipped);
    assert!(streamed
        .skipped
        .iter()
        .any(|(p, why)| p == "a/loop" && why.contains("directory")));
}

#[tokio::test]
async fn fetch_copies_and_verifies() {
    let (d, t) = setup();
    let l = t.list().await.unwrap();
    let e = l.entries.iter().find(|e| e.path == "a/b/x.bin").unwrap();
    let dst = d.path().join("out");
    let f = Arc::new(std::fs::File::create(&dst).unwrap());
    let s = SampleRef {
        path: e.path.clone(),
        size: e.size,
        version: e.version.clone(),
        durable: true,
    };
    assert_eq!(t.fetch(&s, f, &Pacer::unlimited()).await.unwrap(), 10_000);
    assert_eq!(std::fs::read(&dst).unwrap(), vec![7u8; 10_000]);
    // Changed file.
    std::fs::write(t.root().join("a/b/x.bin"), vec![1u8; 10]).unwrap();
    let f = Arc::new(std::fs::File::create(&dst).unwrap());
    let err = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
    assert!(matches!(err, TierError::Changed { .. }), "{err}");
    // Escaping symlink refused at fetch too.
    let f = Arc::new(std::fs::File::create(&dst).unwrap());
    let s = SampleRef {
        path: "leak".into(),
        size: 7,
        version: String::new(),
        durable: true,
    };
    assert!(matches!(
        t.fetch(&s, f, &Pacer::unlimited()).await,
        Err(TierError::Escapes { .. })
    ));
}

/// `fetch_from` copies only the rest, at its own offsets, through a buffer (a small file) and
/// by `copy_file_range` (a large one); a sample changed since cataloguing is refused.
#[tokio::test]
async fn fetch_from_copies_the_rest_at_its_offsets() {
    let (d, t) = setup();
    let big: Vec<u8> = (0..3 * SMALL_FILE_BYTES as usize + 123)
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(t.root().join("big"), &big).unwrap();
    let l = t.list().await.unwrap();
    for (path, want) in [("a/b/x.bin", vec![7u8; 10_000]), ("big", big.clone())] {
        let e = l.entries.iter().find(|e| e.path == path).unwrap();
        let s = SampleRef {
            path: e.path.clone(),
            size: e.size,
            version: e.version.clone(),
            durable: true,
        };
        let dst = d.path().join("out");
        let from = want.len() as u64 / 3;
        // The prefix as an interrupted copy left it.
        std::fs::write(&dst, &want[..from as usize]).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&dst).unwrap();
        let written = Arc::new(crate::Written::new(from));
        let n = t
            .fetch_from(&s, Arc::new(f), from, &Pacer::unlimited(), written.clone())
            .await
            .unwrap();
        assert_eq!(n, Some(e.size - from), "{path}");
        assert_eq!(std::fs::read(&dst).unwrap(), want, "{path}");
        // The copy reports its prefix as it goes; done, all of it.
        assert_eq!(written.get(), e.size, "{path}");
    }
    let e = l.entries.iter().find(|e| e.path == "big").unwrap();
    let s = SampleRef {
        path: e.path.clone(),
        size: e.size,
        version: e.version.clone(),
        durable: false,
    };
    std::fs::write(t.root().join("big"), vec![1u8; big.len() + 1]).unwrap();
    let f = Arc::new(std::fs::File::create(d.path().join("out2")).unwrap());
    let err = t
        .fetch_from(&s, f, 10, &Pacer::unlimited(), Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, TierError::Changed { .. }), "{err}");
}

/// The one-call open beneath the root refuses every way out (relative and absolute
/// symlinks, symlinked directories), and the slow path it falls back to still serves
/// what stays inside, an absolute symlink included.
#[tokio::test]
async fn fetch_follows_links_only_within_the_root() {
    let (d, t) = setup();
    let src = t.root().to_path_buf();
    std::os::unix::fs::symlink("../../secret", src.join("a/up")).unwrap();
    std::os::unix::fs::symlink(d.path(), src.join("a/outdir")).unwrap();
    std::os::unix::fs::symlink("b/x.bin", src.join("a/rel")).unwrap();
    let fetch = |path: &str, size: u64| {
        let t = t.clone();
        let dst = d.path().join("out");
        let s = SampleRef {
            path: path.into(),
            size,
            version: String::new(),
            durable: true,
        };
        async move {
            let f = Arc::new(std::fs::File::create(&dst).unwrap());
            let r = t.fetch(&s, f, &Pacer::unlimited()).await;
            (r, std::fs::read(&dst).unwrap())
        }
    };
    for escaping in ["a/up", "a/outdir/secret", "leak"] {
        let (r, got) = fetch(escaping, 7).await;
        assert!(
            matches!(r, Err(TierError::Escapes { .. })),
            "{escaping}: {r:?}"
        );
        assert!(
            got.is_empty(),
            "{escaping}: bytes from outside were written"
        );
    }
    // Relative within: the fast path. Absolute within: refused by RESOLVE_BENEATH, served
    // by the fallback.
    let (r, got) = fetch("a/rel", 10_000).await;
    assert_eq!(r.unwrap(), 10_000);
    assert_eq!(got, vec![7u8; 10_000]);
    let (r, got) = fetch("alias", 5).await;
    assert_eq!(r.unwrap(), 5);
    assert_eq!(got, b"hello");
}

#[tokio::test]
async fn catalog_currency_follows_directory_changes() {
    let (_d, t) = setup();
    let l = t.list().await.unwrap();
    let mut cat = Catalog::from_entries(t.url(), l.entries).unwrap();
    cat.set_dir_stamps(l.dir_stamps);
    assert!(t.catalog_is_current(&cat).await.unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(t.root().join("a/new"), b"x").unwrap();
    assert!(!t.catalog_is_current(&cat).await.unwrap());
    // The one-stat check sees the root only: a change below it is left to staging.
    assert_eq!(t.catalog_stamp_differs(&cat).await.unwrap(), None);
    std::fs::write(t.root().join("new"), b"x").unwrap();
    let what = t.catalog_stamp_differs(&cat).await.unwrap().unwrap();
    assert!(what.contains("modified at"), "{what}");
}

#[tokio::test]
async fn a_tier_operation_without_progress_times_out() {
    let t0 = std::time::Instant::now();
    let r = watched(
        "src",
        "(listing)",
        std::time::Duration::from_secs(1),
        |_| {
            std::thread::sleep(std::time::Duration::from_secs(3));
            Ok(())
        },
    )
    .await;
    assert!(matches!(r, Err(TierError::Timeout { .. })), "{r:?}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(3));
    // Steady progress keeps an operation alive past the timeout.
    let r = watched("src", "(listing)", std::time::Duration::from_secs(1), |p| {
        for _ in 0..15 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(7)
    })
    .await;
    assert_eq!(r.unwrap(), 7);
}

#[tokio::test]
async fn a_missing_source_root_is_an_outage_not_a_deleted_sample() {
    let (d, t) = setup();
    let f = Arc::new(std::fs::File::create(d.path().join("out")).unwrap());
    let s = SampleRef {
        path: "empty".into(),
        size: 0,
        version: String::new(),
        durable: false,
    };
    std::fs::rename(t.root(), d.path().join("away")).unwrap();
    let err = t
        .fetch(&s, f.clone(), &Pacer::unlimited())
        .await
        .unwrap_err();
    assert!(matches!(err, TierError::Unreachable { .. }), "{err}");
    std::fs::rename(d.path().join("away"), t.root()).unwrap();
    std::fs::remove_file(t.root().join("empty")).unwrap();
    let err = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
    assert!(matches!(err, TierError::NotFound { .. }), "{err}");
}

#[test]
fn missing_source() {
    let err = PosixTier::new(Path::new("/nonexistent/metfs")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/metfs"));
}
