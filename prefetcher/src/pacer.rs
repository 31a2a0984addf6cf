//! Staging bandwidth pacing.
//!
//! A [`Pacer`] is shared by every fetch of a slot; each fetch asks it for permission before it
//! moves a chunk of bytes. Without a rate it admits everything at once. With a rate it is a
//! token bucket (the `governor` crate's GCRA limiter) in units of 4 KiB, with a burst of a
//! twentieth of a second of traffic, so that a cap holds over any window longer than ~100 ms.
//!
//! The rate can be changed while staging runs (`--prefetch-rate auto` does so). `governor`
//! cannot change a quota in place, so a change swaps in a new limiter; a fresh GCRA limiter
//! would start with a full burst, and just-in-time pacing changes the rate often, so each new
//! limiter has its burst drained on creation: the cap then holds across changes, with no burst
//! credit carried over or created. Fetches waiting on the old limiter start over on the new
//! one, so a change takes effect at once.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Granularity of the token bucket: one token is this many bytes.
const UNIT: u64 = 4096;

/// The current cap and its limiter.
type Limit = Option<(u64, Arc<DefaultDirectRateLimiter>)>;

/// Shared staging bandwidth limiter. Cloning shares the same limit.
#[derive(Clone, Default)]
pub struct Pacer {
    inner: Arc<Mutex<Limit>>,
    /// Wakes fetches waiting on a limiter that has just been replaced.
    changed: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for Pacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacer").field("rate", &self.rate()).finish()
    }
}

impl Pacer {
    /// A pacer with no limit.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// A pacer capped at `bytes_per_s` (`None` or 0: unlimited).
    pub fn with_rate(bytes_per_s: Option<u64>) -> Self {
        let p = Self::default();
        p.set_rate(bytes_per_s);
        p
    }

    /// Current cap in bytes per second, if any.
    pub fn rate(&self) -> Option<u64> {
        self.inner.lock().unwrap().as_ref().map(|(r, _)| *r)
    }

    /// Changes the cap; `None` or 0 removes it.
    pub fn set_rate(&self, bytes_per_s: Option<u64>) {
        let mut g = self.inner.lock().unwrap();
        match bytes_per_s.filter(|&r| r > 0) {
            None => *g = None,
            Some(r) => {
                // Changes within 2% are not worth waking every waiting fetch for.
                if g.as_ref().is_some_and(|(old, _)| {
                    let (a, b) = (*old as f64, r as f64);
                    (a - b).abs() <= 0.02 * a.max(b)
                }) {
                    return;
                }
                let per_s = (r / UNIT).clamp(1, u32::MAX as u64) as u32;
                let burst = (per_s / 20).max(Self::max_chunk_units());
                let quota = Quota::per_second(NonZeroU32::new(per_s).unwrap())
                    .allow_burst(NonZeroU32::new(burst).unwrap());
                let limiter = RateLimiter::direct(quota);
                // Start empty: a full bucket on every change would let bursts add up past the
                // cap when the rate changes often.
                let _ = limiter.check_n(NonZeroU32::new(burst).unwrap());
                *g = Some((r, Arc::new(limiter)));
            }
        }
        drop(g);
        self.changed.notify_waiters();
    }

    /// The largest chunk a fetch should move between two calls to [`Pacer::consume`] when a rate
    /// is set, in bytes.
    pub fn chunk_bytes(&self) -> u64 {
        if self.rate().is_some() {
            Self::max_chunk_units() as u64 * UNIT
        } else {
            8 << 20
        }
    }

    fn max_chunk_units() -> u32 {
        // 256 KiB: small enough that a cap is smooth, large enough to stay cheap.
        64
    }

    /// Waits until `bytes` may be moved. A fetch waiting when the rate changes starts over on
    /// the new limiter, so a change takes effect at once instead of after the queue formed
    /// under the old rate has drained.
    pub async fn consume(&self, bytes: u64) {
        let mut units = bytes.div_ceil(UNIT);
        while units > 0 {
            let n = units.min(Self::max_chunk_units() as u64) as u32;
            let notified = self.changed.notified();
            futures::pin_mut!(notified);
            notified.as_mut().enable();
            let limiter = self.inner.lock().unwrap().as_ref().map(|(_, l)| l.clone());
            let Some(limiter) = limiter else { return };
            // A request above the burst can never be satisfied; n <= burst by construction.
            let wait = limiter.until_n_ready(NonZeroU32::new(n).unwrap());
            futures::pin_mut!(wait);
            match futures::future::select(wait, notified).await {
                futures::future::Either::Left(_) => units -= n as u64,
                futures::future::Either::Right(_) => continue,
            }
        }
    }

    /// Blocking variant of [`Pacer::consume`] for staging code running on a blocking thread.
    pub fn consume_blocking(&self, bytes: u64) {
        if self.rate().is_none() {
            return;
        }
        futures::executor::block_on(self.consume(bytes));
    }
}

/// What just-in-time pacing knows when it picks a staging rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JustInTime {
    /// Bytes of the successor still to stage.
    pub bytes_left: u64,
    /// Expected duration of one pass over the current mini-epoch, seconds.
    pub pass_secs: f64,
    /// Passes the policy expects over the current mini-epoch.
    pub expected_rf: f64,
    /// Passes completed over it.
    pub passes_done: f64,
    /// Seconds since the running pass began.
    pub pass_elapsed: f64,
    /// Share of the current mini-epoch's whole expected duration kept as slack: staging aims
    /// to finish this long before the mini-epoch is expected to end.
    pub margin: f64,
    /// The most staging may use, bytes per second.
    pub cap: Option<u64>,
}

/// Below this many seconds before the deadline, staging is late and runs at the cap.
pub const LATE_SECS: f64 = 0.25;
/// The slowest just-in-time rate: keeps staging moving when almost nothing is left.
pub const MIN_JIT_RATE: u64 = 64 << 10;

impl JustInTime {
    /// The rate that finishes the successor at the deadline: the current mini-epoch's expected
    /// end minus `margin` of its expected duration. The deadline is a fixed point in time (it
    /// moves only when the pass duration or the expected rf do), so staging that keeps to the
    /// rate keeps the same rate to the end; a margin proportional to the time *left* would
    /// shrink to nothing and end every mini-epoch in a burst. Late staging (deadline passed or
    /// about to) runs at the cap, or unlimited without one.
    pub fn rate(&self) -> Option<u64> {
        let duration = self.expected_rf.max(1.0) * self.pass_secs;
        let time_left =
            (self.expected_rf - self.passes_done).max(0.0) * self.pass_secs - self.pass_elapsed;
        let until_deadline = time_left - self.margin * duration;
        if !until_deadline.is_finite() || until_deadline < LATE_SECS {
            return self.cap;
        }
        let rate = ((self.bytes_left as f64 / until_deadline).ceil() as u64).max(MIN_JIT_RATE);
        Some(match self.cap {
            Some(c) => rate.min(c),
            None => rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn unlimited_is_instant() {
        let p = Pacer::unlimited();
        let t = Instant::now();
        p.consume(1 << 30).await;
        assert!(t.elapsed().as_millis() < 50);
    }

    #[tokio::test]
    async fn a_rate_change_releases_waiting_fetches() {
        // 64 KiB/s: 1 MiB would take 16 s; raising the cap must release the waiter at once.
        let p = Pacer::with_rate(Some(64 << 10));
        let q = p.clone();
        let t = Instant::now();
        let waiter = tokio::spawn(async move { q.consume(1 << 20).await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        p.set_rate(Some(1 << 30));
        waiter.await.unwrap();
        assert!(t.elapsed().as_secs_f64() < 2.0, "took {:?}", t.elapsed());
    }

    fn jit() -> JustInTime {
        JustInTime {
            bytes_left: 90 << 20,
            pass_secs: 10.0,
            expected_rf: 10.0,
            passes_done: 0.0,
            pass_elapsed: 0.0,
            margin: 0.1,
            cap: None,
        }
    }

    #[test]
    fn just_in_time_finishes_at_the_deadline() {
        // 100 s mini-epoch, 10 s slack: 90 MiB in 90 s.
        assert_eq!(jit().rate(), Some(1 << 20));
        // Keeping to the rate keeps the rate: 45 s later, half is left for the 45 s to go.
        let half = JustInTime {
            bytes_left: 45 << 20,
            passes_done: 4.0,
            pass_elapsed: 5.0,
            ..jit()
        };
        assert_eq!(half.rate(), Some(1 << 20));
        // Behind: a little faster; ahead: slower, but never below the floor.
        let behind = JustInTime {
            bytes_left: 50 << 20,
            ..half
        };
        assert!(behind.rate().unwrap() > 1 << 20);
        let done = JustInTime {
            bytes_left: 1,
            ..half
        };
        assert_eq!(done.rate(), Some(MIN_JIT_RATE));
    }

    #[test]
    fn just_in_time_is_capped_and_late_runs_at_the_cap() {
        let capped = JustInTime {
            cap: Some(512 << 10),
            ..jit()
        };
        assert_eq!(capped.rate(), Some(512 << 10));
        // Past the deadline (9.5 of 10 passes done): the cap, or unlimited without one.
        let late = JustInTime {
            passes_done: 9.0,
            pass_elapsed: 5.0,
            ..jit()
        };
        assert_eq!(late.rate(), None);
        assert_eq!(
            JustInTime {
                cap: Some(7),
                ..late
            }
            .rate(),
            Some(7)
        );
        // More passes than expected (an adaptive policy changed its mind): late too.
        let over = JustInTime {
            passes_done: 12.0,
            ..jit()
        };
        assert_eq!(over.rate(), None);
    }

    #[tokio::test]
    async fn rate_changes_add_no_burst() {
        // Many rate changes in a row, each to a different rate around 4 MiB/s: the bytes
        // admitted over the whole time must stay within the rates in force, plus one chunk.
        let p = Pacer::with_rate(Some(4 << 20));
        let t = Instant::now();
        let mut moved = 0u64;
        for i in 0..8u64 {
            p.set_rate(Some((4 << 20) + i * (256 << 10)));
            p.consume(256 << 10).await;
            moved += 256 << 10;
        }
        let el = t.elapsed().as_secs_f64();
        let most = 6.0 * (1 << 20) as f64 * el + p.chunk_bytes() as f64;
        assert!((moved as f64) <= most, "{moved} bytes in {el:.3} s");
    }

    #[tokio::test]
    async fn cap_slows_down() {
        // 4 MiB/s cap, 2 MiB must take at least ~0.45 s (a new limiter starts empty).
        let p = Pacer::with_rate(Some(4 << 20));
        let t = Instant::now();
        p.consume(2 << 20).await;
        let el = t.elapsed().as_secs_f64();
        assert!(el > 0.45, "took {el}");
        p.set_rate(None);
        let t = Instant::now();
        p.consume(1 << 30).await;
        assert!(t.elapsed().as_millis() < 50);
    }
}
