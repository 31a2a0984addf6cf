//! A new daemon on an existing cache resumes where the last one stopped.

use std::collections::BTreeSet;
use std::time::Duration;

use metfs_fs::view::ROOT_INO;
use metfs_protocol::Choice;

use crate::common::*;
use metfs::daemon::DEFAULT_SESSION;

/// A `|` in the source path (the fingerprint was once a `|`-joined string split by position):
/// the mount resumes, and its rf history's dataset key is the same on another seed, which the
/// key leaves out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_path_with_bars_resumes_and_keeps_its_history_key() {
    let t = setup_in(1, BUDGET, "", "data|v2|x");
    let source = t.cfg.source.clone();
    assert!(source.ends_with("data|v2|x"), "{source}");
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    d.advance(DEFAULT_SESSION, true).await.unwrap();
    // With the successor staged before the stop, the restarted daemon has nothing to fetch, so
    // any tier read is a refetch; otherwise its stager may take up the successor before
    // `status` (it did on a loaded machine).
    wait_next_ready(&d).await;
    let before = d.status();
    drop(d);
    r.stop().await;

    let r = start(t.cfg.clone()).await;
    let after = r.daemon.status();
    assert_eq!(
        (after.epoch, after.mini_epoch, after.generation),
        (before.epoch, before.mini_epoch, before.generation),
        "the position after the restart"
    );
    assert_eq!(after.tier_bytes_read, 0, "the current slot was refetched");
    r.stop().await;

    // Another seed is another plan (a new run at epoch 0), but the same dataset for the history.
    let mut other = t.cfg.clone();
    other.seed += 1;
    let r = start(other).await;
    assert_eq!(
        (r.daemon.status().epoch, r.daemon.status().mini_epoch),
        (0, 0)
    );
    r.stop().await;

    let history: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&t.cfg.history).unwrap()).unwrap();
    let mut keys = BTreeSet::new();
    fn datasets(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let (Some(serde_json::Value::String(d)), Some(_)) =
                    (m.get("dataset"), m.get("job"))
                {
                    out.insert(d.clone());
                }
                m.values().for_each(|x| datasets(x, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| datasets(x, out)),
            _ => {}
        }
    }
    datasets(&history, &mut keys);
    assert_eq!(keys.len(), 1, "one dataset key for both seeds: {keys:?}");
    let key = keys.into_iter().next().unwrap();
    let rest = key
        .strip_prefix(&format!("{source}|"))
        .unwrap_or_else(|| panic!("the key starts with the whole source path: {key}"));
    let slot_bytes: u64 = rest
        .split('|')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("the field after the source is the slot's bytes: {key}"));
    assert!(slot_bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_daemon_on_the_same_cache_resumes_without_refetching() {
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    d.advance(DEFAULT_SESSION, true).await.unwrap();
    // The successor of the new position, staged too, must survive the restart.
    wait_next_ready(&d).await;
    let before = d.status();
    let view_before = read_view(&d.surface().fs());
    assert!(status_u64(&d, "tier_bytes_read") > 0);
    drop(d);
    r.stop().await;

    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let after = d.status();
    assert_eq!(
        (after.epoch, after.mini_epoch, after.generation),
        (before.epoch, before.mini_epoch, before.generation),
        "the position after the restart"
    );
    assert_eq!(after.tier_bytes_read, 0, "the current slot was refetched");
    let view_after = read_view(&d.surface().fs());
    assert!(view_after == view_before, "the resumed view differs");
    check_bytes(&view_after, &t.source);
    // The successor is resumed from its journal, not fetched again, and the switch to it works.
    wait_next_ready(&d).await;
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        0,
        "the successor was refetched"
    );
    let reply = d.advance(DEFAULT_SESSION, true).await.unwrap();
    assert_eq!(reply.decision, Choice::Advance);
    assert_eq!(reply.generation, before.generation + 1);
    check_bytes(&read_view(&d.surface().fs()), &t.source);
    drop(d);
    r.stop().await;
}

/// A retired slot whose deletion comes due after the shutdown began is left to the next
/// start: the exit waits for every blocking task, and the deletion of a slot of 500k files
/// kept an unmounted daemon alive for minutes. The deletion is made due deterministically
/// (the view is held by a kernel reference until the shutdown has begun), so the test does
/// not race a deletion against the clock; without the stop, 110 files go in milliseconds.
/// What is left has no journal; the next daemon deletes it before it fetches (the budget
/// holds), resumes the position and serves the source's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_deletion_due_at_the_shutdown_is_left_to_the_next_start() {
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    wait_next_ready(&d).await;
    let slots = t.cache.join("slots");
    let slot = format!(
        "e{:06}-m{:05}",
        status_u64(&d, "epoch"),
        status_u64(&d, "mini_epoch")
    );
    let fs = d.surface().fs();
    let name = fs.current().root_names()[0].clone();
    let held = fs.lookup(ROOT_INO, &name).unwrap();
    assert_eq!(
        d.advance(DEFAULT_SESSION, true).await.unwrap().decision,
        Choice::Advance
    );
    let before = d.status();
    assert_eq!(before.draining_slots, 1, "the old view is held");
    d.life().begin_shutdown();
    fs.forget(held.ino, 1);
    // The deletion starts (the journal goes first) and stops at once.
    wait_for("the retired slot's journal deleted", || {
        !slots.join(format!("{slot}.journal")).exists()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = std::fs::read_dir(slots.join(&slot)).map_or(0, |rd| rd.count());
    assert!(left > 0, "the slot was deleted after the shutdown began");
    drop((fs, d));
    r.stop().await;

    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let after = d.status();
    assert_eq!(
        (after.epoch, after.mini_epoch, after.generation),
        (before.epoch, before.mini_epoch, before.generation),
        "the position after the restart"
    );
    check_bytes(&read_view(&d.surface().fs()), &t.source);
    // The successor's staging needs the stale slot's room: it fetches once that is free.
    wait_next_ready(&d).await;
    assert!(!slots.join(&slot).exists(), "the stale slot is still there");
    let tmp = std::fs::read_dir(t.cache.join("tmp")).unwrap().count();
    assert_eq!(tmp, 0, "the stale slot's deletion is unfinished in tmp/");
    let used = allocated(&t.cache);
    assert!(
        used <= BUDGET,
        "the cache takes {used} bytes, over {BUDGET}"
    );
    assert_eq!(
        d.advance(DEFAULT_SESSION, true).await.unwrap().decision,
        Choice::Advance
    );
    check_bytes(&read_view(&d.surface().fs()), &t.source);
    drop(d);
    r.stop().await;
}

/// After a clean stop the slots are sealed: the next daemon reads none of their copies at
/// start, checks each at its first open through the core, and fetches a copy damaged in place
/// meanwhile again from the tier before serving it (from a runtime thread here, as the
/// daemon's own tasks would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_resume_checks_copies_at_first_open_and_fetches_a_damaged_one_again() {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    wait_next_ready(&r.daemon).await;
    let slot = r.daemon.surface().fs().current().slot.clone();
    r.stop().await;
    let dir = t.cache.join("slots").join(&slot);
    assert!(t.cache.join("slots").join(format!("{slot}.seal")).exists());
    let (rel, bytes) = t
        .source
        .iter()
        .find(|(k, v)| v.len() > 100 && dir.join(k).exists())
        .expect("a staged copy");
    let p = dir.join(rel);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&[bytes[40] ^ 0xff], 40).unwrap();
    drop(f);

    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        0,
        "a copy was fetched at start"
    );
    let view = read_view(&d.surface().fs());
    check_bytes(&view, &t.source);
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        bytes.len() as u64,
        "exactly the damaged copy is fetched again"
    );
    assert_eq!(std::fs::read(&p).unwrap(), *bytes);
    drop(d);
    r.stop().await;
}
