//! Downloads every object under an S3 prefix into a local directory, three ways, for
//! `benches/s3_staging.sh`:
//!
//! ```text
//! s3_fetch upload  s3://BUCKET/PREFIX COUNT SIZE       # COUNT objects of SIZE bytes (test data)
//! s3_fetch ceiling s3://BUCKET/PREFIX OUTDIR           # raw object_store parallel download
//! s3_fetch ceiling-discard s3://BUCKET/PREFIX          # the same, bytes counted, not written
//! s3_fetch stage   s3://BUCKET/PREFIX OUTDIR [--no-fsync]  # metfs: S3Tier + Stager, one slot
//! ```
//!
//! Endpoint, region and credentials come from the `AWS_*` environment variables
//! (`scripts/garage.sh env DIR` prints them for a test server). Each mode prints one line:
//! `MODE files=N bytes=B seconds=S MiB/s=R`.
//!
//! `ceiling` is what the server gives a client that does nothing but download: object_store
//! with the same HTTP pool and concurrency as the tier (32 objects at once, objects above
//! 8 MiB in 8 MiB ranges, 8 per object, 64 requests in all), every chunk written with `pwrite`
//! on the runtime thread as it arrives, no verification and no `fsync`; `ceiling-discard` does
//! not even write, which is the server's limit. `stage` is metfs staging one mini-epoch that
//! holds every object: listing into a catalog, then the stager (temporary file, ETag-conditioned
//! GETs, size check, `fsync` unless `--no-fsync`, rename, journal). The listing is timed too.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use metfs_prefetcher::stager::{Progress, SlotSpec, Stager, StagerConfig};
use metfs_tier::catalog::Catalog;
use metfs_tier::pacer::Pacer;
use metfs_tier::s3::{S3Config, S3Tier};
use metfs_tier::CapacityTier;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CONCURRENCY: usize = 32;
const PART: u64 = 8 << 20;
const PARTS_PER_OBJECT: usize = 8;
/// Requests in flight at most, as `S3Config::max_requests`.
const MAX_REQUESTS: usize = 64;

fn usage() -> ! {
    eprintln!(
        "usage: s3_fetch upload s3://BUCKET/PREFIX COUNT SIZE\n       \
         s3_fetch ceiling s3://BUCKET/PREFIX OUTDIR\n       \
         s3_fetch ceiling-discard s3://BUCKET/PREFIX\n       \
         s3_fetch stage s3://BUCKET/PREFIX OUTDIR [--no-fsync]"
    );
    std::process::exit(2)
}

fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("s3://").unwrap_or_else(|| usage());
    let (b, p) = rest.split_once('/').unwrap_or((rest, ""));
    (b.to_string(), p.trim_matches('/').to_string())
}

/// A raw object_store client from the environment, with the tier's pool settings.
fn raw_store(bucket: &str) -> Result<AmazonS3, BoxError> {
    let opts = ClientOptions::new()
        .with_timeout(Duration::from_secs(30))
        .with_pool_max_idle_per_host(64)
        .with_allow_http(
            std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.eq_ignore_ascii_case("true")),
        );
    Ok(AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(opts)
        .build()?)
}

fn report(mode: &str, files: usize, bytes: u64, t: Duration) {
    let s = t.as_secs_f64();
    println!(
        "{mode} files={files} bytes={bytes} seconds={s:.3} MiB/s={:.1}",
        bytes as f64 / (1 << 20) as f64 / s
    );
}

async fn upload(url: &str, count: usize, size: usize) -> Result<(), BoxError> {
    let (bucket, prefix) = split_url(url);
    let store = Arc::new(raw_store(&bucket)?);
    let t = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let store = store.clone();
            let key = format!("{prefix}/{i:06}.bin");
            async move {
                // Cheap, incompressible-looking and distinct per object.
                let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let body: Vec<u8> = (0..size)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                store
                    .put(&ObjPath::parse(&key)?, PutPayload::from(body))
                    .await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(8)
        .try_collect::<()>()
        .await?;
    report("upload", count, (count * size) as u64, t.elapsed());
    Ok(())
}

async fn ceiling(url: &str, out: Option<&Path>) -> Result<(), BoxError> {
    let (bucket, prefix) = split_url(url);
    let store = Arc::new(raw_store(&bucket)?);
    let t = Instant::now();
    let objects: Vec<_> = store
        .list(Some(&ObjPath::parse(&prefix)?))
        .try_collect()
        .await?;
    let bytes: u64 = objects.iter().map(|o| o.size).sum();
    let files = objects.len();
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS));
    futures::stream::iter(objects)
        .map(|o| {
            let store = store.clone();
            let permits = permits.clone();
            let dest = out.map(|d| d.join(o.location.filename().unwrap_or("object")));
            async move {
                let file = match dest {
                    Some(d) => Some(Arc::new(std::fs::File::create(d)?)),
                    None => None,
                };
                let ranges: Vec<_> = (0..o.size.div_ceil(PART).max(1))
                    .map(|i| i * PART..((i + 1) * PART).min(o.size))
                    .collect();
                futures::stream::iter(ranges)
                    .map(|r| {
                        let store = store.clone();
                        let file = file.clone();
                        let loc = o.location.clone();
                        let permits = permits.clone();
                        async move {
                            let _permit = permits.acquire().await?;
                            let opts = GetOptions {
                                range: (r.end - r.start < o.size)
                                    .then(|| GetRange::Bounded(r.clone())),
                                ..Default::default()
                            };
                            let mut body = store.get_opts(&loc, opts).await?.into_stream();
                            let mut off = r.start;
                            while let Some(chunk) = body.next().await {
                                let chunk = chunk?;
                                // Straight into the page cache as it arrives, on this thread:
                                // the least work a download can do.
                                if let Some(f) = &file {
                                    f.write_all_at(&chunk, off)?;
                                }
                                off += chunk.len() as u64;
                            }
                            if off != r.end {
                                return Err(format!("{loc}: short read").into());
                            }
                            Ok::<_, BoxError>(())
                        }
                    })
                    .buffer_unordered(PARTS_PER_OBJECT)
                    .try_collect::<()>()
                    .await
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let mode = if out.is_some() {
        "ceiling"
    } else {
        "ceiling-discard"
    };
    report(mode, files, bytes, t.elapsed());
    Ok(())
}

async fn stage(url: &str, out: &Path, fsync: bool) -> Result<(), BoxError> {
    let t = Instant::now();
    let tier = Arc::new(S3Tier::new(url, S3Config::default())?);
    let listing = tier.list().await?;
    let catalog = Arc::new(Catalog::from_entries(tier.url(), listing.entries)?);
    let listed = t.elapsed();
    let cfg = StagerConfig {
        fsync,
        ..Default::default()
    };
    let stager = Stager::new(
        tier,
        catalog.clone(),
        out.join("slots"),
        out.join("tmp"),
        cfg,
        Pacer::unlimited(),
    );
    stager.clean_tmp()?;
    let slot = SlotSpec {
        name: "m0000".into(),
        samples: (0..catalog.len() as u32).collect(),
        ..Default::default()
    };
    let r = stager.stage(&slot, Arc::new(Progress::default())).await?;
    if !r.failed.is_empty() {
        return Err(format!(
            "{} samples failed, first: {:?}",
            r.failed.len(),
            r.failed[0]
        )
        .into());
    }
    let mode = if fsync { "stage" } else { "stage-nofsync" };
    eprintln!("{mode}: listing {:.3} s", listed.as_secs_f64());
    report(mode, catalog.len(), catalog.total_bytes(), t.elapsed());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("upload") if args.len() == 4 => {
            upload(&args[1], args[2].parse()?, args[3].parse()?).await
        }
        Some("ceiling") if args.len() == 3 => {
            let out = PathBuf::from(&args[2]);
            std::fs::create_dir_all(&out)?;
            ceiling(&args[1], Some(&out)).await
        }
        Some("ceiling-discard") if args.len() == 2 => ceiling(&args[1], None).await,
        Some("stage") if args.len() == 3 || args.len() == 4 => {
            let fsync = match args.get(3).map(String::as_str) {
                None => true,
                Some("--no-fsync") => false,
                Some(_) => usage(),
            };
            let out = PathBuf::from(&args[2]);
            std::fs::create_dir_all(&out)?;
            stage(&args[1], &out, fsync).await
        }
        _ => usage(),
    }
}
