//! Leases: a client that reads a view's slot files directly (`files` with `direct`), not
//! through the mount, holds a [`ViewLease`], which pins the view as an open handle does.

use std::sync::Arc;

use super::{FsCore, View};

impl FsCore {
    /// Takes a lease on `view` (see [`ViewLease`]) if it is still shown or retained; `None`
    /// once it has been forgotten, its slot evicted or being evicted.
    pub fn lease(self: &Arc<Self>, view: &Arc<View>) -> Option<ViewLease> {
        let v = self.views.read().unwrap();
        let known =
            v.current_of(view.generation).is_some() || v.retained.contains_key(&view.generation);
        if !known || view.revoked() {
            return None;
        }
        view.lease_taken();
        Some(ViewLease {
            fs: self.clone(),
            view: view.clone(),
        })
    }
}

/// A client's hold on a view whose slot files it reads directly (`files` with `direct`): while
/// any lease is held the view's slot is not evicted, exactly as an open handle pins it.
/// Dropping the lease lets it go, and tells the daemon when that drains a retired view.
pub struct ViewLease {
    fs: Arc<FsCore>,
    view: Arc<View>,
}

impl ViewLease {
    /// The leased view.
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }
}

impl std::fmt::Debug for ViewLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewLease")
            .field("generation", &self.view.generation)
            .field("slot", &self.view.slot)
            .finish()
    }
}

impl Drop for ViewLease {
    fn drop(&mut self) {
        if self.view.lease_ended() == 0 {
            self.fs.notify_if_drained(&self.view);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::*;

    #[test]
    fn a_lease_pins_a_view_until_dropped_and_none_is_given_once_it_is_forgotten() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = Arc::new(FsCore::new(v1, settings()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        core.set_drained_sender(tx);
        let lease = core.lease(&core.current()).unwrap();
        // The direct path is the slot's copy: the bytes the mount shows.
        let f = lease.view().slot_dir.join("d/f");
        assert_eq!(std::fs::read(&f).unwrap(), vec![1u8; 100]);
        let old = core.switch(view(&d, &c, &[0, 1], 2, 1, "s2"));
        assert!(!core.is_drained(&old), "the lease holds the retired view");
        assert!(!core.retire_drained(1), "a leased view is not forgotten");
        assert!(core.retained(1).is_some());
        assert_eq!(old.leases(), 1);
        // A second lease on the retired (still retained) view is given and counted.
        let second = core.lease(&old).unwrap();
        drop(lease);
        assert!(rx.try_recv().is_err(), "one lease still holds it");
        drop(second);
        assert_eq!(
            rx.try_recv().unwrap(),
            1,
            "the last lease's end drains the view"
        );
        assert!(core.retire_drained(1));
        assert!(
            core.lease(&old).is_none(),
            "a forgotten view takes no lease"
        );
        assert!(core.retire_drained(1), "nothing left to hold it");
        assert!(core.retire_drained(77), "a slot never shown may go");
        // The current view is never forgotten, leased or not.
        assert!(!core.retire_drained(2));
        let cur = core.lease(&core.current()).unwrap();
        assert_eq!(cur.view().generation, 2);
    }
}
