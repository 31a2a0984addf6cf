//! Staging bandwidth pacing.
//!
//! A [`Pacer`] is shared by every fetch of a slot; each fetch asks it for permission before it
//! moves a chunk of bytes (at most [`CHUNK`]). Without a rate it admits everything at once.
//! With a rate it is a token bucket in bytes, refilled at the rate and holding at most a
//! twentieth of a second of traffic (at least one chunk), so that a cap holds over any window
//! longer than ~100 ms. Waiters queue in order (a fair async mutex), so no fetch starves.
//!
//! The rate changes while staging runs: `--prefetch-rate auto` retunes it up to four times a
//! second. A change keeps the tokens the bucket holds (capped at the new burst), so a change
//! neither creates a burst nor loses time, and the waiting fetch re-checks at once, so a
//! change takes effect immediately. This is why the bucket is written here rather than taken
//! from a crate: `governor`'s quotas are fixed at construction, and swapping limiters either
//! hands out a fresh burst per change or, drained, loses time per change (measured: staging
//! ran 8-10% under the rate it was set to); `async-speed-limit` changes its rate in place but
//! leaves fetches already waiting on their old schedule, which at a trickle rate is seconds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock is the system's monotonic clock, except in tests that pause it, where the
// bucket's arithmetic can then be checked exactly whatever the machine's load.
use tokio::time::Instant;

/// Most bytes one permission covers: small enough that a cap is smooth, large enough to stay
/// cheap (256 KiB).
pub const CHUNK: u64 = 256 << 10;

/// The token bucket of a cap.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Bytes per second.
    rate: f64,
    /// Most tokens held.
    burst: f64,
    /// Tokens (bytes) available.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Instant,
}

impl Bucket {
    fn new(rate: u64, now: Instant) -> Self {
        Self {
            rate: rate as f64,
            burst: Self::burst_of(rate),
            // A new cap starts empty: it owes nobody a burst.
            tokens: 0.0,
            at: now,
        }
    }

    fn burst_of(rate: u64) -> f64 {
        (rate as f64 / 20.0).max(CHUNK as f64)
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at = now;
    }

    /// Changes the rate at `now`: what accrued at the old rate is kept, up to the new burst.
    fn set_rate(&mut self, rate: u64, now: Instant) {
        self.refill(now);
        self.rate = rate as f64;
        self.burst = Self::burst_of(rate);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Takes `n` bytes (at most the burst) if the bucket holds them; otherwise how long until
    /// it will at the current rate.
    fn take(&mut self, n: u64, now: Instant) -> Option<Duration> {
        self.refill(now);
        let n = n as f64;
        if self.tokens >= n {
            self.tokens -= n;
            None
        } else {
            Some(Duration::from_secs_f64((n - self.tokens) / self.rate))
        }
    }
}

/// Shared staging bandwidth limiter. Cloning shares the same limit.
#[derive(Clone, Default)]
pub struct Pacer {
    inner: Arc<Mutex<Option<Bucket>>>,
    /// Waiting fetches take turns, in order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Wakes the waiting fetch when the rate changes.
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
        self.inner.lock().unwrap().as_ref().map(|b| b.rate as u64)
    }

    /// Changes the cap; `None` or 0 removes it.
    pub fn set_rate(&self, bytes_per_s: Option<u64>) {
        let now = Instant::now();
        {
            let mut g = self.inner.lock().unwrap();
            match (bytes_per_s.filter(|&r| r > 0), g.as_mut()) {
                (None, _) => *g = None,
                (Some(r), Some(b)) => {
                    if b.rate as u64 == r {
                        return;
                    }
                    b.set_rate(r, now);
                }
                (Some(r), None) => *g = Some(Bucket::new(r, now)),
            }
        }
        self.changed.notify_waiters();
    }

    /// The largest chunk a fetch should move between two calls to [`Pacer::consume`], in bytes:
    /// [`CHUNK`] with a rate, 8 MiB without.
    pub fn chunk_bytes(&self) -> u64 {
        if self.rate().is_some() {
            CHUNK
        } else {
            8 << 20
        }
    }

    /// Takes `n` bytes if the bucket holds them, else how long to wait; `None` too when
    /// there is no cap.
    fn try_take(&self, n: u64) -> Option<Duration> {
        self.inner
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|b| b.take(n, Instant::now()))
    }

    /// Waits until `bytes` may be moved, a chunk at a time, in turn with other fetches.
    pub async fn consume(&self, bytes: u64) {
        let mut left = bytes;
        while left > 0 && self.rate().is_some() {
            let n = left.min(CHUNK);
            let _turn = self.turn.lock().await;
            loop {
                let changed = self.changed.notified();
                futures::pin_mut!(changed);
                changed.as_mut().enable();
                let Some(wait) = self.try_take(n) else { break };
                let sleep = tokio::time::sleep(wait);
                futures::pin_mut!(sleep);
                futures::future::select(sleep, changed).await;
            }
            left -= n;
        }
    }

    /// Blocking variant of [`Pacer::consume`] for staging code running on a blocking thread.
    /// It re-checks at least every 50 ms, so a rate change takes effect within that.
    pub fn consume_blocking(&self, bytes: u64) {
        let mut left = bytes;
        while left > 0 && self.rate().is_some() {
            let n = left.min(CHUNK);
            while let Some(wait) = self.try_take(n) {
                std::thread::sleep(wait.min(Duration::from_millis(50)));
            }
            left -= n;
        }
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

    #[tokio::test]
    async fn unlimited_is_instant() {
        let p = Pacer::unlimited();
        let t = Instant::now();
        p.consume(1 << 30).await;
        assert!(t.elapsed().as_millis() < 50);
    }

    #[tokio::test(start_paused = true)]
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

    #[tokio::test(start_paused = true)]
    async fn rate_changes_neither_add_bursts_nor_lose_time() {
        // 4 MiB/s, retuned every 50 ms between 4.0 and 4.2 MiB/s: the bytes admitted stay
        // under the higher rate (plus one chunk), and above most of the lower one: a change
        // that handed out a fresh burst would exceed the first bound, one that emptied the
        // bucket would lose a chunk per change and fall far below the second.
        let (low, high) = (4u64 << 20, (4u64 << 20) + (200 << 10));
        let p = Pacer::with_rate(Some(low));
        let t = Instant::now();
        let q = p.clone();
        let consumer = tokio::spawn(async move {
            let mut moved = 0u64;
            while t.elapsed().as_secs_f64() < 1.5 {
                q.consume(CHUNK).await;
                moved += CHUNK;
            }
            moved
        });
        let mut i = 0u64;
        while t.elapsed().as_secs_f64() < 1.5 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            i += 1;
            p.set_rate(Some(if i.is_multiple_of(2) { low } else { high }));
        }
        let moved = consumer.await.unwrap() as f64;
        let el = t.elapsed().as_secs_f64();
        assert!(
            moved <= high as f64 * el + CHUNK as f64,
            "{moved} bytes in {el:.2} s"
        );
        assert!(
            moved >= 0.8 * low as f64 * 1.5,
            "{moved} bytes in {el:.2} s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cap_slows_down() {
        // 4 MiB/s cap, 2 MiB take 0.5 s: a new cap starts with an empty bucket.
        let p = Pacer::with_rate(Some(4 << 20));
        let t = Instant::now();
        p.consume(2 << 20).await;
        let el = t.elapsed().as_secs_f64();
        assert!((0.49..0.6).contains(&el), "took {el}");
        p.set_rate(None);
        let t = Instant::now();
        p.consume(1 << 30).await;
        assert!(t.elapsed().as_millis() < 50);
    }
}
