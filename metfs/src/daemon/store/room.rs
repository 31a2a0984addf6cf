//! Room for a staging on a shared mount ([`Store::room_for`]): whether a slot fits the
//! budget beside what the node holds, and if not which samples of held slots to trim
//! (RefCnt's order) or which held slots to let go ([`Trim`], [`Room`]).

use crate::daemon::store::{Book, Store};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// What [`Store::room_for`] answers a staging on a shared mount.
#[derive(Debug)]
pub(in crate::daemon) enum Room {
    /// The files on the node and the staging fit the budget: stage.
    Fits,
    /// Held slots were let go (or nothing can go yet): stage once they are deleted.
    Wait,
    /// Samples were trimmed from held slots: stage once [`Trim::run`] has deleted their files
    /// and [`Store::trimmed`] has been told.
    Trim(Trim),
}

/// Samples trimmed from held slots, whose files are to be deleted (see [`Store::room_for`]).
#[derive(Debug)]
pub(in crate::daemon) struct Trim {
    /// Every name of every trimmed sample.
    files: Vec<PathBuf>,
    /// The slots they are in.
    slots: BTreeSet<String>,
    /// The bytes their deletion frees.
    bytes: u64,
    /// How many samples were trimmed.
    pub(in crate::daemon) samples: usize,
}

impl Trim {
    /// Deletes the trimmed files (one already gone is fine); whether every one is gone.
    /// Blocking.
    pub(in crate::daemon) fn run(&self) -> bool {
        let mut ok = true;
        for f in &self.files {
            match std::fs::remove_file(f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::error!(path = %f.display(), error = %e, "cannot delete a trimmed sample; its bytes stay counted until its slot is deleted");
                    ok = false;
                }
            }
        }
        ok
    }
}

impl Store {
    /// Before a staging of `samples` on a shared mount: whether the files on the node (every
    /// slot, draining ones included, each file once) and what the staging adds fit the two
    /// slots' bytes ([`Room::Fits`]). If they will once the deletions under way are done, the
    /// staging waits ([`Room::Wait`]). If not, room is made, in RefCnt's order (paper 004):
    ///
    /// 1. **Single samples of held slots** no view can read any more (their last handle has
    ///    closed) and no other slot holds: lowest reference count first (`refs`: how many jobs
    ///    still need the sample this epoch), then the oldest slot's, then the lowest id. Their
    ///    files are deleted by the caller ([`Room::Trim`], [`Trim::run`], [`Store::trimmed`]);
    ///    the rest of each slot stays a donor. A slot's samples are needed by the other jobs
    ///    about as much as another slot's, so it is at the grain of samples that the order
    ///    keeps what a slower job will still read.
    /// 2. If that is not enough, **whole held slots** (those still read, or in container mode),
    ///    the one whose samples are needed least first, then the oldest; the staging waits for
    ///    their deletion.
    ///
    /// So a slot another job cannot let go of (a frozen reader holds it open) costs its bytes,
    /// not every job's staging, while the budget holds.
    pub(in crate::daemon) fn room_for(&self, samples: &[u32], refs: impl Fn(u32) -> u32) -> Room {
        let limit = 2 * self.budget.slot_bytes;
        let mut b = self.book.lock().unwrap();
        if self.bytes_with(&b, &[], samples, true) <= limit {
            return Room::Fits;
        }
        // What the node will hold once the slots let go are deleted and the trims under way
        // are done.
        let after = |b: &Book| {
            let deleting: Vec<&str> = b
                .draining
                .values()
                .filter(|s| !b.held.contains(*s))
                .map(String::as_str)
                .collect();
            self.bytes_with(b, &deleting, samples, false)
        };
        let short = after(&b);
        if short <= limit {
            tracing::debug!(
                now = self.bytes_with(&b, &[], samples, true),
                after = short,
                limit,
                trimming = b.trimming,
                stuck = b.trimmed_not_freed(false),
                held = b.held.len(),
                "room_for: wait for deletions under way"
            );
            return Room::Wait;
        }
        let trim = self.trim_held(&mut b, short - limit, &refs);
        let mut released = false;
        while after(&b) > limit {
            // Draining slots by generation, so `min_by_key` keeps the oldest among equals.
            let victim = b
                .draining
                .values()
                .filter(|s| b.held.contains(*s))
                .min_by_key(|s| {
                    b.samples
                        .get(*s)
                        .map_or(0, |x| x.iter().map(|&id| u64::from(refs(id))).sum::<u64>())
                })
                .cloned();
            match victim {
                Some(s) => {
                    b.held.remove(&s);
                    released = true;
                }
                None => break,
            };
        }
        tracing::debug!(
            short,
            limit,
            trimmed = trim.as_ref().map(|t| t.samples),
            released,
            held = b.held.len(),
            after = after(&b),
            "room_for: made room"
        );
        drop(b);
        if released {
            self.released.notify_waiters();
        }
        match trim {
            Some(t) => Room::Trim(t),
            None => Room::Wait,
        }
    }

    /// Takes samples out of held slots whose views nobody reads any more (step 1 of
    /// [`Store::room_for`]) until their files free `deficit` bytes or none is left: removes
    /// them from the book, counts their bytes as being deleted, and returns their files.
    fn trim_held(&self, b: &mut Book, deficit: u64, refs: &impl Fn(u32) -> u32) -> Option<Trim> {
        // A container holds many samples: it cannot lose one.
        if self.containers.is_some() {
            return None;
        }
        // Held slots whose deletion is claimed: their last handle has closed.
        let slots: Vec<(u64, String)> = b
            .draining
            .iter()
            .filter(|(g, s)| b.held.contains(*s) && b.evicting.contains(*g))
            .map(|(g, s)| (*g, s.clone()))
            .collect();
        if slots.is_empty() {
            return None;
        }
        let names: Vec<&str> = slots.iter().map(|(_, s)| s.as_str()).collect();
        // A sample another slot also holds frees nothing (or is read): not a candidate.
        let elsewhere = b.on_node(self.footprints.len(), &names);
        // Each candidate: the oldest generation that holds it, and its files (one per origin).
        let mut cands: HashMap<u32, (u64, Vec<&str>)> = HashMap::new();
        for (gen, slot) in &slots {
            let origins = b.origins.get(slot);
            for &id in b.samples.get(slot).map_or(&[][..], |x| &x[..]) {
                if elsewhere[id as usize] {
                    continue;
                }
                let origin = origins
                    .and_then(|o| o.get(id))
                    .map_or(slot.as_str(), |o| &**o);
                let e = cands.entry(id).or_insert((*gen, Vec::new()));
                if !e.1.contains(&origin) {
                    e.1.push(origin);
                }
            }
        }
        let mut order: Vec<(u32, u64, u32, u64)> = cands
            .iter()
            .map(|(&id, (gen, files))| {
                let bytes = self.footprints[id as usize] * files.len() as u64;
                (refs(id), *gen, id, bytes)
            })
            .collect();
        drop(cands);
        order.sort_unstable();
        let mut victim = vec![false; self.footprints.len()];
        let (mut bytes, mut count) = (0u64, 0usize);
        for (_, _, id, freed) in order {
            if bytes >= deficit {
                break;
            }
            victim[id as usize] = true;
            bytes += freed;
            count += 1;
        }
        if count == 0 {
            return None;
        }
        let mut trim = Trim {
            files: Vec::new(),
            slots: BTreeSet::new(),
            bytes,
            samples: count,
        };
        for (_, slot) in &slots {
            let Some(held) = b.samples.get(slot).cloned() else {
                continue;
            };
            let (gone, kept): (Vec<u32>, Vec<u32>) =
                held.iter().partition(|&&id| victim[id as usize]);
            if gone.is_empty() {
                continue;
            }
            let dir = self.stager.slot_path(slot);
            trim.files
                .extend(gone.iter().map(|&id| dir.join(self.stager.staged_path(id))));
            if let Some(f) = b.footprints.get_mut(slot) {
                *f = f.saturating_sub(self.footprint(&gone));
            }
            if kept.is_empty() {
                // Nothing left to give: the slot goes whole (its deletion is claimed already).
                b.held.remove(slot);
            }
            b.samples.insert(slot.clone(), Arc::new(kept));
            trim.slots.insert(slot.clone());
        }
        b.trimming += bytes;
        b.trimmed_samples += count as u64;
        Some(trim)
    }

    /// The files of `trim` are deleted (`ok`: every one of them); their bytes are free. If some
    /// could not be deleted, the trim's bytes count until each of its slots is deleted whole.
    pub(in crate::daemon) fn trimmed(&self, trim: &Trim, ok: bool) {
        let mut b = self.book.lock().unwrap();
        b.trimming = b.trimming.saturating_sub(trim.bytes);
        if !ok {
            b.stuck.push((trim.slots.clone(), trim.bytes));
        }
        drop(b);
        self.released.notify_waiters();
    }
}
