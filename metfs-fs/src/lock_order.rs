//! The lock order, declared once as [`Level`] and checked in debug builds.
//!
//! The daemon's module docs ("Lock order") say which lock may be taken while another is held;
//! [`OrderedMutex`] holds a lock's place in that order, and in a debug build (every test) each
//! thread keeps the levels it holds: taking a lock whose level is not after every level the
//! thread holds panics, naming both, before it can deadlock in production. A release build
//! keeps no list and checks nothing; the wrapper is then a `std::sync::Mutex` and a level.
//!
//! # Invariants
//!
//! * A thread holding a lock of level `a` takes a lock of level `b` only if `b > a`: so no two
//!   threads can each wait for a lock the other holds (the levels are a total order).
//! * Guards may be dropped in any order; each drop forgets its own level once.
//! * Only locks whose guards stay on one thread are ordered here: a std guard cannot cross an
//!   `.await` (it is not `Send`), so a thread's list is the truth. The async locks held across
//!   round trips (the dds worker, one apply at a time) come first in the order and stay
//!   outside it.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A lock's place in the order, outermost first (the daemon's module docs say what each holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `Daemon::persisting`: the order of the position, rf-history and `share.json` writes.
    Persisting,
    /// `Daemon::sessions`: every session.
    Sessions,
    /// `Shared::cohort`: the jobs' views, shares and reference counts.
    Cohort,
    /// `Shared::jobs`: each job's token, last request and held-back flag.
    Jobs,
    /// `Shared::last_join`.
    LastJoin,
    /// A `History` store: the rf history in memory.
    History,
    /// `Aggregate::layouts`.
    Layouts,
    /// `Aggregate::last_wait`.
    LastWait,
    /// `Store::book`: each slot's bytes and samples.
    Book,
    /// `Daemon::me`.
    Me,
    /// `FsCore::reply_gate`: shared while an entry is resolved and replied, exclusive while a
    /// view switches.
    ReplyGate,
    /// `FsCore::root_listings`: a shared mount's root listings, by handle.
    RootListings,
    /// `FsCore::views`: the current view, the jobs' views and the retained ones.
    Views,
    /// `FsCore::handles`: the open handles and the views they pin.
    Handles,
    /// `FsCore::live_backing`: the passthrough backing ids registered.
    LiveBacking,
    /// `FsCore::drained`: where the generations of drained views are sent.
    Drained,
    /// `QueueFeed::retry_at`: when etcd is asked again after a failure.
    RetryAt,
    /// `QueueFeed::pending_done`: the batches to mark DONE.
    PendingDone,
    /// `QueueFeed::snapshot`: the worker's state for `status`.
    QueueSnapshot,
    /// `EventLog::queue`: the event log's queue to its writer.
    EventQueue,
    /// The event log's `written`: lines written so far.
    EventWritten,
    /// `EventLog::done`: the writer's end.
    EventDone,
    /// `Surface::kernel`: the kernel's caches, once mounted.
    Kernel,
    /// `Surface::mountpoint`.
    Mountpoint,
}

#[cfg(debug_assertions)]
thread_local! {
    /// The levels this thread holds, in the order taken.
    static HELD: std::cell::RefCell<Vec<Level>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A level this thread holds: checked against the others when taken, forgotten when dropped.
/// A guard keeps it in its last field, so that the lock itself is released first.
struct Held {
    #[cfg(debug_assertions)]
    level: Level,
}

impl Held {
    /// Takes `level`: in a debug build, panics when this thread holds it or a later one.
    #[cfg_attr(not(debug_assertions), allow(unused_variables))]
    fn take(level: Level) -> Self {
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(&top) = held.iter().max() {
                assert!(
                    level > top,
                    "lock order: {level:?} taken while this thread holds {top:?} (the daemon's module docs, \"Lock order\")"
                );
            }
            held.push(level);
        });
        Held {
            #[cfg(debug_assertions)]
            level,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(i) = held.iter().rposition(|&l| l == self.level) {
                held.remove(i);
            }
        });
    }
}

/// Wraps a std lock result's guard (poisoned or not) with the level it holds.
fn ordered<G, W>(
    r: Result<G, PoisonError<G>>,
    held: Held,
    wrap: impl FnOnce(G, Held) -> W,
) -> Result<W, PoisonError<W>> {
    match r {
        Ok(g) => Ok(wrap(g, held)),
        Err(e) => Err(PoisonError::new(wrap(e.into_inner(), held))),
    }
}

/// A mutex with its [`Level`]: `lock` checks the order in debug builds.
#[derive(Debug)]
pub struct OrderedMutex<T> {
    level: Level,
    inner: Mutex<T>,
}

/// The guard of an [`OrderedMutex`]; its drop forgets its level.
pub struct OrderedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    _held: Held,
}

impl<T> OrderedMutex<T> {
    /// A lock at `level` holding `value`.
    pub const fn new(level: Level, value: T) -> Self {
        Self {
            level,
            inner: Mutex::new(value),
        }
    }

    /// Takes the lock, as `std::sync::Mutex::lock` does. In a debug build, panics when this
    /// thread holds a lock of this level or a later one.
    #[allow(clippy::type_complexity)]
    pub fn lock(&self) -> Result<OrderedGuard<'_, T>, PoisonError<OrderedGuard<'_, T>>> {
        let held = Held::take(self.level);
        ordered(self.inner.lock(), held, |guard, _held| OrderedGuard {
            guard,
            _held,
        })
    }

    /// The value, without locking (the caller owns the lock).
    pub fn get_mut(&mut self) -> Result<&mut T, PoisonError<&mut T>> {
        self.inner.get_mut()
    }

    /// The lock's level.
    pub fn level(&self) -> Level {
        self.level
    }
}

impl<T> Deref for OrderedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for OrderedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A reader-writer lock with its [`Level`]: `read` and `write` check the order in debug builds.
/// A thread takes a level once, shared or not: a second `read` of the same lock on one thread
/// is refused too, since a writer waiting between the two would deadlock it.
#[derive(Debug)]
pub struct OrderedRwLock<T> {
    level: Level,
    inner: RwLock<T>,
}

/// The shared guard of an [`OrderedRwLock`].
pub struct OrderedReadGuard<'a, T> {
    guard: RwLockReadGuard<'a, T>,
    _held: Held,
}

/// The exclusive guard of an [`OrderedRwLock`].
pub struct OrderedWriteGuard<'a, T> {
    guard: RwLockWriteGuard<'a, T>,
    _held: Held,
}

impl<T> OrderedRwLock<T> {
    /// A lock at `level` holding `value`.
    pub const fn new(level: Level, value: T) -> Self {
        Self {
            level,
            inner: RwLock::new(value),
        }
    }

    /// Takes the lock shared, as `std::sync::RwLock::read` does, checking the order.
    #[allow(clippy::type_complexity)]
    pub fn read(&self) -> Result<OrderedReadGuard<'_, T>, PoisonError<OrderedReadGuard<'_, T>>> {
        let held = Held::take(self.level);
        ordered(self.inner.read(), held, |guard, _held| OrderedReadGuard {
            guard,
            _held,
        })
    }

    /// Takes the lock exclusive, as `std::sync::RwLock::write` does, checking the order.
    #[allow(clippy::type_complexity)]
    pub fn write(&self) -> Result<OrderedWriteGuard<'_, T>, PoisonError<OrderedWriteGuard<'_, T>>> {
        let held = Held::take(self.level);
        ordered(self.inner.write(), held, |guard, _held| OrderedWriteGuard {
            guard,
            _held,
        })
    }
}

impl<T> Deref for OrderedReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> Deref for OrderedWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for OrderedWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_in_order_and_out_of_drop_order() {
        let a = OrderedMutex::new(Level::Sessions, 1);
        let b = OrderedMutex::new(Level::Cohort, 2);
        let c = OrderedMutex::new(Level::Book, 3);
        let ga = a.lock().unwrap();
        let gb = b.lock().unwrap();
        drop(ga);
        // Book after Cohort: still in order with Sessions gone.
        let gc = c.lock().unwrap();
        assert_eq!(*gb + *gc, 5);
        drop(gb);
        drop(gc);
        // Nothing held: any lock again.
        let _ = a.lock().unwrap();
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_lock_out_of_order_panics_naming_both() {
        let book = OrderedMutex::new(Level::Book, ());
        let sessions = OrderedMutex::new(Level::Sessions, ());
        let r = std::thread::spawn(move || {
            let _b = book.lock().unwrap();
            let _s = sessions.lock().unwrap();
        })
        .join();
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("Sessions taken while this thread holds Book"),
            "{msg}"
        );
    }

    #[test]
    fn rw_locks_take_their_place_shared_or_not() {
        let gate = OrderedRwLock::new(Level::ReplyGate, ());
        let views = OrderedRwLock::new(Level::Views, 1);
        let handles = OrderedMutex::new(Level::Handles, 2);
        {
            let _g = gate.read().unwrap();
            let v = views.read().unwrap();
            let h = handles.lock().unwrap();
            assert_eq!(*v + *h, 3);
        }
        // Released, the same locks again, exclusive this time.
        let _g = gate.write().unwrap();
        *views.write().unwrap() += 1;
        assert_eq!(*views.read().unwrap(), 2);
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_second_read_of_one_lock_on_one_thread_panics() {
        // A writer waiting between the two reads would deadlock the thread.
        let r = std::thread::spawn(|| {
            let gate = OrderedRwLock::new(Level::ReplyGate, ());
            let _a = gate.read().unwrap();
            let _b = gate.read().unwrap();
        })
        .join();
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("ReplyGate taken while this thread holds ReplyGate"),
            "{msg}"
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    fn the_core_under_the_daemon_and_not_the_reverse() {
        let views = OrderedRwLock::new(Level::Views, ());
        let book = OrderedMutex::new(Level::Book, ());
        let r = std::thread::spawn(move || {
            let _v = views.read().unwrap();
            let _b = book.lock().unwrap();
        })
        .join();
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("Book taken while this thread holds Views"),
            "{msg}"
        );
    }

    #[test]
    fn a_poisoned_lock_still_gives_its_value() {
        let m = std::sync::Arc::new(OrderedMutex::new(Level::Jobs, 7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        let g = m.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(*g, 7);
    }
}
