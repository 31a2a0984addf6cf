//! The stall watch: a fetch, or any staging work, abandoned with [`TierError::Timeout`] when
//! it makes no progress for [`Stager::stall_limit`] (the configured timeout plus the longest
//! wait the pacer may impose).

use std::sync::Arc;
use std::time::{Duration, Instant};

use metfs_tier::{SampleRef, TierError, Written};

use super::partial::Mark;

use super::Stager;

impl Stager {
    /// How long a fetch may go without progress before it is abandoned: the configured timeout
    /// plus the longest wait the pacer may impose (every concurrent fetch ahead of it taking
    /// one chunk at the capped rate).
    pub(super) fn stall_limit(&self) -> Duration {
        let paced = match self.pacer.rate() {
            Some(r) if r > 0 => Duration::from_secs_f64(
                self.cfg.concurrency.max(1) as f64 * self.pacer.chunk_bytes() as f64 / r as f64,
            ),
            _ => Duration::ZERO,
        };
        Duration::from_secs(self.cfg.timeout_secs.max(1)) + paced
    }

    /// Fetches `sample` into `file`, failing with [`TierError::Timeout`] when the copy makes no
    /// progress (neither its size nor its allocated blocks grow; parallel ranged writes fill
    /// holes below the size) for [`Stager::stall_limit`]. Returns where the fetch began and how
    /// many bytes it read from the tier.
    ///
    /// A partial copy (`mark`, whose file holds the sample's first `from` bytes) is continued
    /// with [`metfs_tier::CapacityTier::fetch_from`], its first attempt too (from 0), so that
    /// the tier reports how far it is written (`written`), which goes into the mark at each
    /// look of the watch. Where the tier serves no range, the whole sample is fetched again,
    /// `file` emptied first.
    pub(super) async fn fetch_watched(
        &self,
        sample: &SampleRef,
        file: Arc<std::fs::File>,
        from: u64,
        written: &Arc<Written>,
        mut mark: Option<&mut Mark>,
    ) -> Result<(u64, u64), TierError> {
        use std::os::unix::fs::MetadataExt;
        let resumable = mark.is_some();
        let look = || {
            if let Some(m) = mark.as_deref_mut() {
                m.record(written);
            }
            file.metadata().map(|m| (m.len(), m.blocks())).ok()
        };
        let fut = async {
            if resumable {
                let rest =
                    self.tier
                        .fetch_from(sample, file.clone(), from, &self.pacer, written.clone());
                if let Some(n) = rest.await? {
                    if from > 0 {
                        tracing::info!(sample = %sample.path, from, "continued an interrupted copy");
                    }
                    return Ok((from, n));
                }
                if from > 0 {
                    tracing::debug!(sample = %sample.path, from, "the tier cannot continue a copy; fetching it whole");
                    file.set_len(0).map_err(|source| TierError::Local {
                        path: sample.path.clone(),
                        source,
                    })?;
                }
            }
            let n = self.tier.fetch(sample, file.clone(), &self.pacer).await?;
            Ok((0, n))
        };
        self.stall_watched(fut, look, || sample.path.clone())
            .await
            .and_then(|r| r)
    }

    /// Awaits `fut`, failing with [`TierError::Timeout`] for the sample named by `what` when
    /// `progress` returns the same value for [`Stager::stall_limit`] (the work is then
    /// abandoned: a blocking thread stuck in the kernel cannot be stopped).
    pub(super) async fn stall_watched<T, P: PartialEq>(
        &self,
        fut: impl std::future::Future<Output = T>,
        mut progress: impl FnMut() -> P,
        what: impl FnOnce() -> String,
    ) -> Result<T, TierError> {
        tokio::pin!(fut);
        // The first look is a tick away, not now: most fetches of small files are done by
        // then, and a `stat` of the file just created would cost them a system call each.
        let every = Duration::from_millis(250);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut last = None;
        let mut since = Instant::now();
        loop {
            tokio::select! {
                r = &mut fut => return Ok(r),
                _ = tick.tick() => {
                    let now = Some(progress());
                    if now != last {
                        last = now;
                        since = Instant::now();
                    } else if since.elapsed() >= self.stall_limit() {
                        return Err(TierError::Timeout {
                            url: self.tier.url().to_string(),
                            path: what(),
                            secs: since.elapsed().as_secs(),
                        });
                    }
                }
            }
        }
    }
}
