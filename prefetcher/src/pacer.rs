//! Staging bandwidth pacing.
//!
//! A [`Pacer`] is shared by every fetch of a slot; each fetch asks it for permission before it
//! moves a chunk of bytes. Without a rate it admits everything at once. With a rate it is a
//! token bucket (the `governor` crate's GCRA limiter) in units of 4 KiB, with a burst of a
//! twentieth of a second of traffic, so that a cap holds over any window longer than ~100 ms.
//! The rate can be changed while staging runs (`--prefetch-rate auto` does so); a change swaps
//! in a new limiter.

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
                // A new limiter starts with a full burst; swapping on every small change would
                // let those bursts add up past the cap. Changes within 20% are ignored.
                if g.as_ref().is_some_and(|(old, _)| {
                    let (a, b) = (*old as f64, r as f64);
                    (a - b).abs() <= 0.2 * a.max(b)
                }) {
                    return;
                }
                let per_s = (r / UNIT).clamp(1, u32::MAX as u64) as u32;
                let burst = (per_s / 20).max(Self::max_chunk_units());
                let quota = Quota::per_second(NonZeroU32::new(per_s).unwrap())
                    .allow_burst(NonZeroU32::new(burst).unwrap());
                *g = Some((r, Arc::new(RateLimiter::direct(quota))));
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
        p.consume(p.chunk_bytes()).await;
        let q = p.clone();
        let t = Instant::now();
        let waiter = tokio::spawn(async move { q.consume(1 << 20).await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        p.set_rate(Some(1 << 30));
        waiter.await.unwrap();
        assert!(t.elapsed().as_secs_f64() < 2.0, "took {:?}", t.elapsed());
    }

    #[tokio::test]
    async fn cap_slows_down() {
        // 4 MiB/s cap, 2 MiB after the burst must take at least ~0.4 s.
        let p = Pacer::with_rate(Some(4 << 20));
        p.consume(p.chunk_bytes()).await; // drain the burst
        let t = Instant::now();
        p.consume(2 << 20).await;
        let el = t.elapsed().as_secs_f64();
        assert!(el > 0.35, "took {el}");
        p.set_rate(None);
        let t = Instant::now();
        p.consume(1 << 30).await;
        assert!(t.elapsed().as_millis() < 50);
    }
}
