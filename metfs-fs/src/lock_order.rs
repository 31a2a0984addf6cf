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
use std::sync::{Mutex, MutexGuard, PoisonError};

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
}

#[cfg(debug_assertions)]
thread_local! {
    /// The levels this thread holds, in the order taken.
    static HELD: std::cell::RefCell<Vec<Level>> = const { std::cell::RefCell::new(Vec::new()) };
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
    #[cfg(debug_assertions)]
    level: Level,
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
        #[cfg(debug_assertions)]
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(&top) = held.iter().max() {
                assert!(
                    self.level > top,
                    "lock order: {:?} taken while this thread holds {top:?} (the daemon's module docs, \"Lock order\")",
                    self.level
                );
            }
            held.push(self.level);
        });
        let wrap = |guard| OrderedGuard {
            guard,
            #[cfg(debug_assertions)]
            level: self.level,
        };
        match self.inner.lock() {
            Ok(g) => Ok(wrap(g)),
            Err(e) => Err(PoisonError::new(wrap(e.into_inner()))),
        }
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

impl<T> Drop for OrderedGuard<'_, T> {
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
