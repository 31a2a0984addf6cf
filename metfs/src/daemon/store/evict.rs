//! Deletions in the cache, all through the store: retired slots once their views drained
//! ([`Store::evict_retired`]), slots never shown ([`Store::drop_slot`], [`Store::remove_now`]),
//! kept slots a resumed job cannot use ([`Store::discard`]) and, at startup, whatever no kept
//! slot owns ([`Store::remove_slots_except`]). The book's claims on a deletion are taken and
//! ended only here.

use crate::daemon::store::{Stop, Store};
use std::time::Duration;

impl Store {
    /// Deletes `slot`, staged but never shown (its job left first), and frees its bytes.
    pub(in crate::daemon) async fn drop_slot(&self, slot: &str) {
        let stager = self.stager.clone();
        let name = slot.to_string();
        match tokio::task::spawn_blocking(move || stager.evict(&name)).await {
            Ok(Ok(())) => self.forget_slot(slot),
            other => {
                tracing::error!(slot, result = ?other.map(|r| r.err()), "cannot delete a slot of a job that left")
            }
        }
    }

    /// Deletes `slot` now and frees its bytes: a first slot of which nothing could be staged
    /// (the mount fails).
    pub(in crate::daemon) fn remove_now(&self, slot: &str) {
        if let Err(e) = self.stager.evict(slot) {
            tracing::warn!(slot, error = %e, "cannot delete the slot");
        }
        self.forget_slot(slot);
    }

    /// Frees `slot`'s bytes in the book and deletes its files in the background: a kept slot
    /// that a resumed job cannot use (it starts over).
    pub(in crate::daemon) fn discard(&self, slot: &str) {
        self.forget_slot(slot);
        if let Err(e) = self.stager.evict_in_background(slot) {
            tracing::warn!(slot, error = %e, "cannot delete the slot");
        }
    }

    /// At startup, before anything is staged: deletes in the background every slot on disk
    /// that `keep` refuses (a retired slot of 500k files takes minutes to delete, and the mount
    /// need not wait for it: staging fetches nothing until it is), and the journals and seals
    /// of no slot `keep` accepts (a journal's file is `<slot>.journal`, a seal's
    /// `<slot>.seal`). Returns the kept slots whose seal holds: they resume without reading
    /// their copies.
    pub(in crate::daemon) fn remove_slots_except(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, metfs_prefetcher::stager::StageError> {
        for name in self.stager.present_slots() {
            if !keep(&name) {
                self.stager.evict_in_background(&name)?;
            }
        }
        if let Ok(rd) = std::fs::read_dir(&self.paths.slots) {
            for e in rd.flatten() {
                let file = e.file_name();
                let kept = file
                    .to_str()
                    .and_then(|f| f.rsplit_once('.'))
                    .is_some_and(|(slot, _)| keep(slot));
                if e.file_type().is_ok_and(|t| t.is_file()) && !kept {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let sealed = self.stager.take_seals();
        if !sealed.is_empty() {
            tracing::info!(slots = ?sealed, "sealed at the last clean shutdown");
        }
        Ok(sealed)
    }

    /// Waits until `slot` is not held for a staging (bounded by `give_up` returning true, checked
    /// every 200 ms).
    async fn wait_unheld(&self, slot: &str, give_up: impl Fn() -> bool) {
        loop {
            let notified = self.released.notified();
            if !self.book.lock().unwrap().held.contains(slot) || give_up() {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    }

    /// Deletes generation `gen`'s retired slot, unless a deletion of it runs already or
    /// `retire` (the filesystem core forgetting the view) says something still reads it. The
    /// slot stays draining until its files are gone, so the stager admits no byte of the next
    /// slot while they still take space: the budget holds at every instant, not only between
    /// switches. A slot held for the next staging goes once that staging has taken its
    /// samples. A deletion that fails is reported and retried with a growing pause (staging
    /// waits for it); one that `stop` interrupts (the shutdown) leaves the slot draining, for
    /// the next start to delete before it fetches anything. Returns whether it was deleted.
    pub(in crate::daemon) async fn evict_retired(
        &self,
        gen: u64,
        retire: impl FnOnce() -> bool,
        stop: Stop,
    ) -> bool {
        // The drain channel and the switch may both ask; one deletion runs.
        let Some(slot) = self.claim_eviction(gen) else {
            return false;
        };
        if !retire() {
            self.abandon_eviction(gen);
            return false;
        }
        self.wait_unheld(&slot, || stop()).await;
        let mut pause = Duration::from_millis(200);
        loop {
            let stager = self.stager.clone();
            let name = slot.clone();
            // The deletion stops at the shutdown: the process's exit waits for every blocking
            // task, and a slot of 500k files took minutes to delete, with SIGTERM already
            // taken by the daemon. What is left has no journal; the next start deletes it
            // before it fetches anything, so the budget still holds.
            let stopper = stop.clone();
            let error = match tokio::task::spawn_blocking(move || {
                stager.evict_unless(&name, &|| stopper())
            })
            .await
            {
                Ok(Ok(true)) => break,
                Ok(Ok(false)) => {
                    tracing::info!(slot = %slot, "slot deletion stopped by the shutdown; the next start finishes it");
                    self.abandon_eviction(gen);
                    return false;
                }
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            tracing::error!(slot = %slot, error = %error, retry_in_s = pause.as_secs_f64(), "eviction failed; staging waits for it");
            self.note_error(format!("evicting slot {slot}: {error}"));
            if stop() {
                self.abandon_eviction(gen);
                return false;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
        tracing::info!(slot = %slot, "evicted");
        self.evicted(gen, &slot);
        true
    }

    /// Claims the deletion of generation `gen`'s slot: its name, unless it is not draining or
    /// a deletion of it runs already.
    fn claim_eviction(&self, gen: u64) -> Option<String> {
        let mut b = self.book.lock().unwrap();
        let slot = b.draining.get(&gen).cloned()?;
        b.evicting.insert(gen).then_some(slot)
    }

    /// Gives up a claimed deletion (the daemon is shutting down); the slot stays draining.
    fn abandon_eviction(&self, gen: u64) {
        self.book.lock().unwrap().evicting.remove(&gen);
    }

    /// The slot of generation `gen` is deleted: its bytes are free.
    fn evicted(&self, gen: u64, slot: &str) {
        let mut b = self.book.lock().unwrap();
        b.evicting.remove(&gen);
        b.draining.remove(&gen);
        b.footprints.remove(slot);
        b.samples.remove(slot);
        b.held.remove(slot);
        // Links into this slot from others keep its name as their origin: the file lives on.
        b.origins.remove(slot);
        for (slots, _) in &mut b.stuck {
            slots.remove(slot);
        }
        b.stuck.retain(|(slots, _)| !slots.is_empty());
    }
}
