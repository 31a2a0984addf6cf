//! A bounded concurrent cache by key: the core's open backing files and passthrough backing
//! ids (see the parent module), so that millions of files never exhaust descriptors.
//!
//! The map is split into shards, each behind its own lock, so that concurrent FUSE threads
//! reading different files rarely meet; a read takes its shard's lock shared.
//!
//! Invariants:
//! * a shard holds at most `ceil(capacity / shards)` entries. An insert into a full shard
//!   evicts one by CLOCK (second chance): the hand skips, once, an entry read since it last
//!   passed. Evicting drops the cache's reference only; whoever holds a clone keeps the value
//!   (an open handle keeps its file, and its backing id registered);
//! * a value leaves the cache outside its shard's lock, so closing a file or unregistering a
//!   backing id (a system call) never stalls other readers of the shard;
//! * [`BoundedCache::get_or_try_insert_with`] runs one `init` per key at a time: a concurrent
//!   caller for the same key waits for it and takes the value it made, or, if it failed, runs
//!   its own `init` after it (still one at a time);
//! * [`BoundedCache::invalidate_if`] removes at once: when it returns, the cache holds no
//!   reference to what it removed (a retired view's descriptors are closed then, unless a
//!   handle still holds them).
//!
//! Locks: a key's turn (held across its `init`), then the map of turns, then a shard; a
//! shard's lock is never held while another lock is taken.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Shards of a cache (fewer for a capacity below this).
const SHARDS: usize = 16;

/// A bounded map from keys to cheaply cloned values (module doc).
pub(super) struct BoundedCache<K, V> {
    shards: Box<[RwLock<Shard<K, V>>]>,
    /// Most entries a shard holds.
    per_shard: usize,
    hasher: RandomState,
    /// The keys whose `init` runs or is awaited now, each with the lock whose holder runs it.
    /// An entry is removed by the last caller that held it (counted under this lock).
    turns: Mutex<HashMap<K, Arc<Mutex<()>>>>,
}

struct Shard<K, V> {
    map: HashMap<K, Slot<V>>,
    /// The clock: every key of `map` once, in the order the hand meets them.
    hand: VecDeque<K>,
}

struct Slot<V> {
    value: V,
    /// Read since the hand last passed it.
    used: AtomicBool,
}

impl<K, V> Shard<K, V>
where
    K: Hash + Eq + Clone,
{
    /// Inserts `value` under `key`, evicting one entry if the shard is full; returns what left
    /// the shard (the value replaced or evicted), to be dropped after the lock.
    fn insert(&mut self, key: K, value: V, capacity: usize) -> Option<V> {
        if let Some(slot) = self.map.get_mut(&key) {
            *slot.used.get_mut() = true;
            return Some(std::mem::replace(&mut slot.value, value));
        }
        let mut out = None;
        while self.map.len() >= capacity {
            let Some(k) = self.hand.pop_front() else {
                break;
            };
            let Some(slot) = self.map.get_mut(&k) else {
                continue;
            };
            if std::mem::take(slot.used.get_mut()) {
                self.hand.push_back(k);
            } else {
                out = self.map.remove(&k).map(|s| s.value);
                break;
            }
        }
        self.hand.push_back(key.clone());
        self.map.insert(
            key,
            Slot {
                value,
                used: AtomicBool::new(false),
            },
        );
        out
    }
}

impl<K, V> BoundedCache<K, V>
where
    K: Hash + Eq + Clone,
    V: Clone,
{
    /// A cache of at most about `capacity` entries (at least one).
    pub(super) fn new(capacity: u64) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX).max(1);
        Self::with_shards(capacity, SHARDS.min(capacity))
    }

    fn with_shards(capacity: usize, shards: usize) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| {
                    RwLock::new(Shard {
                        map: HashMap::new(),
                        hand: VecDeque::new(),
                    })
                })
                .collect(),
            per_shard: capacity.div_ceil(shards),
            hasher: RandomState::new(),
            turns: Mutex::new(HashMap::new()),
        }
    }

    fn shard(&self, key: &K) -> &RwLock<Shard<K, V>> {
        let i = self.hasher.hash_one(key) % self.shards.len() as u64;
        &self.shards[i as usize]
    }

    /// The value of `key`, if cached.
    pub(super) fn get(&self, key: &K) -> Option<V> {
        let shard = self.shard(key).read().unwrap_or_else(|e| e.into_inner());
        let slot = shard.map.get(key)?;
        // Written only when it changes: a file read by many threads stays a shared line.
        if !slot.used.load(Ordering::Relaxed) {
            slot.used.store(true, Ordering::Relaxed);
        }
        Some(slot.value.clone())
    }

    /// Caches `value` under `key`, evicting another entry if its shard is full.
    pub(super) fn insert(&self, key: K, value: V) {
        let out = {
            let mut shard = self.shard(&key).write().unwrap_or_else(|e| e.into_inner());
            shard.insert(key, value, self.per_shard)
        };
        drop(out);
    }

    /// The value of `key`, made by `init` and cached if missing; one `init` per key runs at a
    /// time (module doc). `init`'s error is returned to its own caller only.
    pub(super) fn get_or_try_insert_with<E>(
        &self,
        key: K,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        if let Some(v) = self.get(&key) {
            return Ok(v);
        }
        let turn = self
            .turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let held = turn.lock().unwrap_or_else(|e| e.into_inner());
        // A caller ahead of this one may have made it while this one waited.
        let got = match self.get(&key) {
            Some(v) => Ok(v),
            None => init().inspect(|v| self.insert(key.clone(), v.clone())),
        };
        let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        drop(held);
        // Clones are made and dropped only under `turns`, so the count is exact here: the map's
        // and this caller's mean nobody else waits for the key.
        if Arc::strong_count(&turn) == 2 {
            turns.remove(&key);
        }
        drop(turn);
        got
    }

    /// Removes every entry whose key satisfies `pred`, at once.
    pub(super) fn invalidate_if(&self, pred: impl Fn(&K) -> bool) {
        for shard in self.shards.iter() {
            let mut out = Vec::new();
            {
                let mut s = shard.write().unwrap_or_else(|e| e.into_inner());
                let Shard { map, hand } = &mut *s;
                hand.retain(|k| {
                    if !pred(k) {
                        return true;
                    }
                    out.extend(map.remove(k).map(|slot| slot.value));
                    false
                });
            }
            drop(out);
        }
    }

    /// Entries cached now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap().map.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn holds_at_most_its_capacity_and_drops_what_it_evicts() {
        let cache = BoundedCache::new(64);
        let values: Vec<Arc<u32>> = (0..1000).map(Arc::new).collect();
        for (i, v) in values.iter().enumerate() {
            cache.insert(i as u32, v.clone());
            assert!(cache.len() <= 64 + SHARDS, "{} entries", cache.len());
        }
        let held = values.iter().filter(|v| Arc::strong_count(v) > 1).count();
        assert_eq!(
            held,
            cache.len(),
            "an evicted value is no longer referenced"
        );
        let cached = (0..1000u32).filter(|k| cache.get(k).is_some()).count();
        assert_eq!(cached, cache.len());
    }

    #[test]
    fn a_value_read_since_the_hand_passed_gets_a_second_chance() {
        let cache = BoundedCache::with_shards(2, 1);
        cache.insert(1u32, "a");
        cache.insert(2, "b");
        assert_eq!(cache.get(&1), Some("a"));
        // The hand meets `a` first, read since: it goes round once more and `b` goes.
        cache.insert(3, "c");
        assert_eq!(cache.get(&1), Some("a"));
        assert_eq!(cache.get(&2), None);
        assert_eq!(cache.get(&3), Some("c"));
        // Now `a` and `c` were both read: the hand clears both and takes `a`, met first.
        cache.insert(4, "d");
        assert_eq!(cache.get(&1), None);
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn invalidation_removes_at_once() {
        let cache = BoundedCache::new(1000);
        let kept = Arc::new(1u8);
        let gone = Arc::new(2u8);
        for i in 0..10u32 {
            cache.insert((1u64, i), gone.clone());
            cache.insert((2u64, i), kept.clone());
        }
        cache.invalidate_if(|k| k.0 == 1);
        assert_eq!(
            Arc::strong_count(&gone),
            1,
            "nothing of generation 1 is held"
        );
        assert_eq!(Arc::strong_count(&kept), 11);
        assert_eq!(cache.get(&(1, 3)), None);
        assert_eq!(cache.get(&(2, 3)).as_deref(), Some(&1));
        // The clock forgot the removed keys too: filling the cache evicts only live entries.
        let hand: usize = cache
            .shards
            .iter()
            .map(|s| s.read().unwrap().hand.len())
            .sum();
        assert_eq!(hand, 10);
    }

    #[test]
    fn concurrent_misses_of_one_key_run_one_init() {
        let cache = Arc::new(BoundedCache::new(16));
        let inits = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (cache, inits) = (cache.clone(), inits.clone());
                std::thread::spawn(move || {
                    cache
                        .get_or_try_insert_with(7u32, || {
                            inits.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            Ok::<_, ()>(Arc::new(70u32))
                        })
                        .unwrap()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(*t.join().unwrap(), 70);
        }
        assert_eq!(inits.load(Ordering::SeqCst), 1);
        assert!(
            cache.turns.lock().unwrap().is_empty(),
            "no turn is left behind"
        );
    }

    #[test]
    fn a_failed_init_caches_nothing_and_the_next_caller_tries_again() {
        let cache = BoundedCache::new(16);
        assert_eq!(
            cache.get_or_try_insert_with(1u32, || Err::<u32, _>("refused")),
            Err("refused")
        );
        assert_eq!(cache.get(&1), None);
        assert_eq!(cache.get_or_try_insert_with(1, || Ok::<_, ()>(5)), Ok(5));
        assert_eq!(cache.get_or_try_insert_with(1, || Err("not called")), Ok(5));
        assert!(cache.turns.lock().unwrap().is_empty());
    }
}
