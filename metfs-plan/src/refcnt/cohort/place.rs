//! A job's place across a restart: what [`Cohort::saved`] gives, and how [`Cohort::rejoin`]
//! checks a saved place against the views it implies (`owed_by_place`) before restoring it,
//! so that a damaged or foreign `share.json` is refused, never half applied.

use super::{Cohort, CohortError, MemberState, View};

impl Cohort {
    /// Job `name`'s place, to be saved (module docs).
    pub fn saved(&self, name: &str) -> Option<MemberState> {
        let m = self.members.get(name)?;
        Some(MemberState {
            drawing: m.drawing,
            undrawn: m.idx.map(|i| self.sampler.undrawn(i)),
            open: m.open.clone(),
            queue: m.queue.iter().cloned().collect(),
            current: m.current.clone(),
            next: m.next.clone(),
            reading: m.reading,
            needs: self.ledger.needs_of(m.id),
        })
    }

    /// Job `name` rejoins with its dataset, view bound and saved place: its share is taken as
    /// at [`Cohort::join`], its current and next views pinned and counted as staged (their
    /// slots were kept), its owed reads restored, and it re-enters the sampler with the
    /// samples it had not drawn. The place is checked first ([`Cohort::check_place`]), so a
    /// place from another dataset or one whose parts disagree is refused
    /// ([`CohortError::BadSaved`], naming the field) and the cohort is left as it was.
    pub fn rejoin(
        &mut self,
        name: &str,
        dataset: &[u32],
        view_bytes: u64,
        saved: MemberState,
    ) -> Result<(), CohortError> {
        self.check_place(name, dataset, view_bytes, &saved)?;
        // Joined as new (share, sampler checks), then given its place.
        self.join(name, dataset, view_bytes)?;
        let restored = self.restore_place(name, view_bytes, &saved);
        if restored.is_err() {
            let _ = self.leave(name);
        }
        restored
    }

    /// Checks a saved place against the job's dataset and view bound: every sample of it is
    /// in the dataset, every view within the bound and of the bytes it says, the views'
    /// epochs in order between the epoch read and the epoch drawn, each epoch's views hold a
    /// sample at most once (and all of the dataset in an epoch not begun), and the owed reads
    /// are exactly those its views imply ([`owed_by_place`]). [`Cohort::saved`] gives only
    /// places that pass (the property test in `cohort_tests`).
    pub fn check_place(
        &self,
        name: &str,
        dataset: &[u32],
        view_bytes: u64,
        saved: &MemberState,
    ) -> Result<(), CohortError> {
        let bad = |field: &'static str, reason: String| CohortError::BadSaved {
            job: name.to_string(),
            field,
            reason,
        };
        let mut sorted = dataset.to_vec();
        sorted.sort_unstable();
        let check = |field: &'static str, samples: &[u32]| -> Result<u64, CohortError> {
            let mut bytes = 0u64;
            for &s in samples {
                if sorted.binary_search(&s).is_err() {
                    return Err(bad(
                        field,
                        format!("sample {s} is not in the job's dataset"),
                    ));
                }
                bytes += self.sizes.get(s as usize).copied().unwrap_or(0);
            }
            Ok(bytes)
        };
        for (field, v) in place_views(saved) {
            let bytes = check(field, &v.samples)?;
            if bytes != v.bytes || (field != "open" && bytes > view_bytes) {
                return Err(bad(
                    field,
                    format!(
                        "a view of {bytes} bytes (saved as {}), its bound is {view_bytes}",
                        v.bytes
                    ),
                ));
            }
        }
        if let Some(u) = &saved.undrawn {
            check("undrawn", u)?;
        }
        let owed: Vec<u32> = saved.needs.iter().map(|n| n.0).collect();
        check("needs", &owed)?;
        let want = owed_by_place(saved, &sorted).map_err(|(field, reason)| bad(field, reason))?;
        if want != saved.needs {
            let count = |v: &[(u32, u32)], s: u32| {
                v.binary_search_by_key(&s, |n| n.0).map_or(0, |i| v[i].1)
            };
            let s = sorted
                .iter()
                .copied()
                .find(|&s| count(&want, s) != count(&saved.needs, s))
                .unwrap_or(0);
            return Err(bad(
                "needs",
                format!(
                    "sample {s} owes {} reads, its views say {} (epochs {} to {})",
                    count(&saved.needs, s),
                    count(&want, s),
                    saved.reading,
                    saved.drawing
                ),
            ));
        }
        Ok(())
    }

    /// Gives job `name`, just joined as new, its checked place `saved`.
    fn restore_place(
        &mut self,
        name: &str,
        view_bytes: u64,
        saved: &MemberState,
    ) -> Result<(), CohortError> {
        let store = |source| CohortError::Store {
            job: name.to_string(),
            source,
        };
        let m = self.members.get_mut(name).expect("just joined");
        let id = m.id;
        if let Some(i) = m.idx.take() {
            self.sampler.remove_job(i);
        }
        let undrawn = saved.undrawn.clone().filter(|u| !u.is_empty());
        let idx = match &undrawn {
            Some(u) => Some(
                self.sampler
                    .add_job(u)
                    .map_err(|source| CohortError::Sampler {
                        job: name.to_string(),
                        source,
                    })?,
            ),
            None => None,
        };
        // The join counted one read of every sample; the saved reads replace them.
        self.ledger.leave(id).map_err(store)?;
        self.ledger
            .join(id, view_bytes.saturating_mul(2))
            .map_err(store)?;
        self.ledger.owe(id, &saved.needs).map_err(store)?;
        for v in saved.current.iter().chain(saved.next.iter()) {
            let pins: Vec<(u32, u64)> = v
                .samples
                .iter()
                .map(|&s| (s, self.sizes[s as usize]))
                .collect();
            self.ledger.pin(id, &pins).map_err(store)?;
            if !self.external {
                for &(s, size) in &pins {
                    self.ledger.stage(s, size).map_err(store)?;
                }
            }
        }
        let m = self.members.get_mut(name).expect("just joined");
        m.idx = idx;
        m.drawing = saved.drawing;
        m.open = saved.open.clone();
        m.queue = saved.queue.iter().cloned().collect();
        m.current = saved.current.clone();
        m.next = saved.next.clone();
        m.reading = saved.reading;
        Ok(())
    }
}

/// A place's views in the order the job reads them: current, next, queued, open.
fn place_views(place: &MemberState) -> impl Iterator<Item = (&'static str, &View)> {
    place
        .current
        .iter()
        .map(|v| ("current", v))
        .chain(place.next.iter().map(|v| ("next", v)))
        .chain(place.queue.iter().map(|v| ("queue", v)))
        .chain([("open", &place.open)])
}

/// The reads a job at `place` owes, by sample ascending (`sorted`: its dataset, ascending),
/// derived from its views; or the field and reason its views do not hold together.
///
/// Invariant (from [`Ledger::need`] and [`Ledger::consumed`] as the cohort calls them): each
/// epoch the job has started adds one read of every sample (the join starts epoch 0,
/// `draw_for` each later one as the job, or any job with it between epochs, needs a view),
/// and leaving a view it read takes one read of its samples. The job reads its views in
/// order, so every epoch after the one it reads (`reading`) up to the one it draws
/// (`drawing`) is owed whole, and of the epoch it reads only what is not read yet: the
/// samples of that epoch's views (current, next, queued, open) and, while it still draws it,
/// its undrawn ones. A sample is owed `drawing − reading` reads, plus one if unread in the
/// epoch read: up to `drawing − reading + 1`, since the other jobs' requests draw a job's
/// views ahead across as many epochs as it lags behind them.
fn owed_by_place(
    place: &MemberState,
    sorted: &[u32],
) -> Result<Vec<(u32, u32)>, (&'static str, String)> {
    let (reading, drawing) = (place.reading, place.drawing);
    if reading > drawing {
        return Err((
            "reading",
            format!("epoch {reading} is past the drawing epoch {drawing}"),
        ));
    }
    match &place.current {
        Some(c) if c.epoch != reading => {
            return Err((
                "current",
                format!("is of epoch {}, the epoch read is {reading}", c.epoch),
            ))
        }
        None if reading != 0 => {
            return Err(("reading", format!("epoch {reading} without a current view")))
        }
        _ => {}
    }
    let views: Vec<(&'static str, &View)> = place_views(place).collect();
    let mut last = reading;
    for &(field, v) in &views {
        if v.epoch < last || v.epoch > drawing {
            return Err((
                field,
                format!(
                    "epoch {} is out of order (after epoch {last}, drawing {drawing})",
                    v.epoch
                ),
            ));
        }
        last = v.epoch;
    }
    let undrawn = place.undrawn.as_deref().unwrap_or(&[]);
    let mut unread = Vec::new();
    let mut at = 0;
    // Ends within views + 1 epochs: an epoch past the first holds the whole dataset.
    for e in reading..=drawing {
        let mut held: Vec<u32> = Vec::new();
        while at < views.len() && views[at].1.epoch == e {
            held.extend(&views[at].1.samples);
            at += 1;
        }
        if e == drawing {
            held.extend(undrawn);
        }
        held.sort_unstable();
        if let Some(w) = held.windows(2).find(|w| w[0] == w[1]) {
            return Err(("queue", format!("sample {} is twice in epoch {e}", w[0])));
        }
        let begun = e == reading && place.current.is_some();
        if !begun && held.len() != sorted.len() {
            return Err((
                "queue",
                format!(
                    "epoch {e} holds {} of the dataset's {} samples, not yet read",
                    held.len(),
                    sorted.len()
                ),
            ));
        }
        if e == reading {
            unread = held;
        }
    }
    let ahead = u32::try_from(drawing - reading)
        .map_err(|_| ("drawing", format!("epoch {drawing} is too far ahead")))?;
    Ok(sorted
        .iter()
        .map(|&s| (s, ahead + u32::from(unread.binary_search(&s).is_ok())))
        .filter(|n| n.1 > 0)
        .collect())
}
