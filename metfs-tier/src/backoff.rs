//! Retry with backoff: how long to wait before the next try of something that failed in a
//! way worth retrying, and when to stop trying.
//!
//! One [`Backoff`] follows one operation's retries. It is made when the first try starts (or
//! when the first failure is seen, if the time limit should count from there), and each
//! failure asks [`Backoff::next_wait`] for the wait before the next try: `None` means give
//! up. The waits grow in one of two ways:
//!
//! * [`Backoff::doubling`]: `first`, then twice the previous wait, at most `cap` (the `n`-th
//!   wait, from 0, is [`doubled`]`(first, cap, n)`);
//! * [`Backoff::decorrelated`]: `object_store`'s "decorrelated jitter" (see
//!   [`S3RetryConfig`](crate::s3::S3RetryConfig)): the first wait is `first`, and each next
//!   one is drawn uniformly between `first` and `base` times the previous one, at most `cap`.
//!
//! It gives up after [`Backoff::max_retries`] retries, or once [`Backoff::give_up_after`]'s
//! limit has passed since the backoff was made, whichever comes first; with neither it never
//! gives up. The caller sleeps: this module has no clock of its own but `Instant`, and no
//! runtime.

use std::time::{Duration, Instant};

/// How the waits of a [`Backoff`] grow.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Growth {
    /// Each wait twice the one before.
    Doubling,
    /// Each wait drawn uniformly between the first wait and `base` times the one before.
    Decorrelated { base: f64 },
}

/// One operation's retries: the wait before each, and when to give up (see the module doc).
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    growth: Growth,
    max_retries: Option<usize>,
    limit: Option<Duration>,
    start: Instant,
    retries: usize,
    /// The wait before the next retry.
    wait: Duration,
}

/// The `n`-th wait (from 0) of waits that start at `first` and double, at most `cap`.
pub fn doubled(first: Duration, cap: Duration, n: u32) -> Duration {
    first.saturating_mul(1u32 << n.min(31)).min(cap)
}

impl Backoff {
    /// Waits `first`, then twice the previous wait, at most `cap`; never gives up until told
    /// when (`max_retries`, `give_up_after`). Its clock starts now.
    pub fn doubling(first: Duration, cap: Duration) -> Self {
        Self::new(first, cap, Growth::Doubling)
    }

    /// Waits `first`, then each time a wait drawn uniformly between `first` and `base` times
    /// the previous wait (at least `first`), at most `cap`. Its clock starts now.
    pub fn decorrelated(first: Duration, base: f64, cap: Duration) -> Self {
        Self::new(first, cap, Growth::Decorrelated { base })
    }

    fn new(first: Duration, cap: Duration, growth: Growth) -> Self {
        let wait = match growth {
            Growth::Doubling => doubled(first, cap, 0),
            Growth::Decorrelated { .. } => first,
        };
        Self {
            first,
            cap,
            growth,
            max_retries: None,
            limit: None,
            start: Instant::now(),
            retries: 0,
            wait,
        }
    }

    /// Gives up after `n` retries (`n + 1` tries in all).
    pub fn max_retries(mut self, n: usize) -> Self {
        self.max_retries = Some(n);
        self
    }

    /// Gives up once `limit` has passed since the backoff was made.
    pub fn give_up_after(mut self, limit: Duration) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Retries so far.
    pub fn retries(&self) -> usize {
        self.retries
    }

    /// Time since the backoff was made.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// After a failed try: the wait before the next one (counted as a retry), or `None` to
    /// give up.
    pub fn next_wait(&mut self) -> Option<Duration> {
        self.next_wait_with(rand::random::<f64>())
    }

    /// [`Backoff::next_wait`] with `u` (in `[0, 1)`) as the random draw of the wait after it.
    fn next_wait_with(&mut self, u: f64) -> Option<Duration> {
        let out_of_retries = self.max_retries.is_some_and(|n| self.retries >= n);
        let out_of_time = self.limit.is_some_and(|l| self.start.elapsed() >= l);
        if out_of_retries || out_of_time {
            return None;
        }
        self.retries += 1;
        let wait = self.wait;
        self.wait = self.grow(wait, u);
        Some(wait)
    }

    /// The wait after `wait`.
    fn grow(&self, wait: Duration, u: f64) -> Duration {
        match self.growth {
            Growth::Doubling => doubled(self.first, self.cap, self.retries.min(31) as u32),
            Growth::Decorrelated { base } => {
                let first = self.first.as_secs_f64();
                let high = (wait.as_secs_f64() * base).max(first);
                Duration::from_secs_f64((first + u * (high - first)).min(self.cap.as_secs_f64()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{doubled, Backoff};
    use proptest::prelude::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubling_doubles_up_to_the_cap() {
        let mut b = Backoff::doubling(200 * MS, 5000 * MS);
        let waits: Vec<_> = (0..8).map(|_| b.next_wait().unwrap()).collect();
        let ms: Vec<_> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(b.retries(), 8);
    }

    #[test]
    fn doubled_is_the_daemons_pause() {
        // 2 s, 4 s, ... at most 60 s, as `2 << (failures - 1).min(5)` capped at 60.
        for failures in 1u32..=100 {
            let old =
                Duration::from_secs(2u64 << (failures - 1).min(5)).min(Duration::from_secs(60));
            let new = doubled(
                Duration::from_secs(2),
                Duration::from_secs(60),
                failures - 1,
            );
            assert_eq!(old, new, "failures {failures}");
        }
        // No overflow however many.
        assert_eq!(
            doubled(Duration::MAX, Duration::MAX, u32::MAX),
            Duration::MAX
        );
    }

    #[test]
    fn gives_up_after_max_retries() {
        let mut b = Backoff::doubling(MS, MS).max_retries(3);
        assert!(b.next_wait().is_some());
        assert!(b.next_wait().is_some());
        assert!(b.next_wait().is_some());
        assert_eq!(b.next_wait(), None);
        assert_eq!(b.next_wait(), None);
        assert_eq!(b.retries(), 3);
        let mut none = Backoff::doubling(MS, MS).max_retries(0);
        assert_eq!(none.next_wait(), None);
    }

    #[test]
    fn gives_up_once_the_time_limit_passed() {
        let mut now = Backoff::doubling(MS, MS).give_up_after(Duration::ZERO);
        assert_eq!(now.next_wait(), None);
        assert_eq!(now.retries(), 0);
        let mut later = Backoff::doubling(MS, MS).give_up_after(Duration::from_secs(3600));
        for _ in 0..100 {
            assert_eq!(later.next_wait(), Some(MS));
        }
        // Whichever rule comes first.
        let mut both = Backoff::doubling(MS, MS)
            .give_up_after(Duration::from_secs(3600))
            .max_retries(1);
        assert!(both.next_wait().is_some());
        assert_eq!(both.next_wait(), None);
    }

    #[test]
    fn decorrelated_draws_between_first_and_base_times_the_last() {
        let mut b = Backoff::decorrelated(100 * MS, 3.0, 5000 * MS);
        assert_eq!(b.next_wait_with(0.0), Some(100 * MS));
        // u = 0 draws the first wait again; u -> 1 draws base times the previous.
        assert_eq!(b.next_wait_with(0.999_999), Some(100 * MS));
        let w = b.next_wait_with(0.5).unwrap();
        assert!((w.as_secs_f64() - 0.3).abs() < 1e-5, "{w:?}");
        // The wait after 0.3 s drawn at u = 0.5: halfway between 0.1 s and 0.9 s.
        let w = b.next_wait_with(0.0).unwrap();
        assert!((w.as_secs_f64() - 0.5).abs() < 1e-5, "{w:?}");
    }

    proptest! {
        /// Every decorrelated wait after the first lies between the first wait (or the cap,
        /// if lower) and the cap, and is at most `base` times the previous wait when that is
        /// above the first; it gives up exactly after `max_retries`.
        #[test]
        fn decorrelated_waits_stay_in_bounds(
            first_ms in 1u64..2000,
            cap_ms in 1u64..10_000,
            base in 1.0f64..10.0,
            max in 0usize..40,
            draws in proptest::collection::vec(0.0f64..1.0, 40),
        ) {
            let (first, cap) = (Duration::from_millis(first_ms), Duration::from_millis(cap_ms));
            let mut b = Backoff::decorrelated(first, base, cap).max_retries(max);
            let mut prev: Option<Duration> = None;
            for (i, &u) in draws.iter().enumerate() {
                let w = b.next_wait_with(u);
                if i >= max {
                    prop_assert_eq!(w, None);
                    continue;
                }
                let w = w.unwrap();
                match prev {
                    None => prop_assert_eq!(w, first),
                    Some(p) => {
                        let tol = 1e-6;
                        prop_assert!(w.as_secs_f64() <= cap.as_secs_f64() + tol);
                        prop_assert!(w.as_secs_f64() + tol >= first.min(cap).as_secs_f64());
                        let high = (p.as_secs_f64() * base).max(first.as_secs_f64());
                        prop_assert!(w.as_secs_f64() <= high + tol);
                    }
                }
                prev = Some(w);
            }
            prop_assert_eq!(b.retries(), max.min(draws.len()));
        }

        /// Doubling waits never shrink, never pass the cap, and follow `doubled`.
        #[test]
        fn doubling_waits_grow_to_the_cap(first_ms in 0u64..10_000, cap_ms in 0u64..100_000) {
            let (first, cap) = (Duration::from_millis(first_ms), Duration::from_millis(cap_ms));
            let mut b = Backoff::doubling(first, cap);
            let mut prev = Duration::ZERO;
            for n in 0..64u32 {
                let w = b.next_wait().unwrap();
                prop_assert_eq!(w, doubled(first, cap, n));
                prop_assert!(w >= prev && w <= cap);
                prev = w;
            }
        }
    }
}
