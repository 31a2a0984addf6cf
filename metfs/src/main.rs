//! `metfs`: mini-epoch training over FUSE.
//!
//! The binary is a thin CLI (clap) over the daemon modules; `anyhow` is used only here, to add
//! context to the modules' typed errors on their way to the user.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Subcommand};
use prefetcher::planner::Strategy;

use metfs::config::{reference, Layers, MountConfig, MountSettings, ReadPath};
use metfs::protocol::{Decision, FilesView, Reply, Request, Staging, Status};
use metfs::{client, control, daemon, fuse, logging, mount, report};

#[derive(clap::Parser)]
#[command(
    name = "metfs",
    version,
    about = "Mini-epoch training over FUSE: serve the current mini-epoch from node-local storage while the next one is staged",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount a MET view of a dataset (returns once the first mini-epoch is staged).
    Mount(Box<MountArgs>),
    /// Print the settings a mount with these flags, this environment and this config file
    /// would run with, each with where it came from (or, with --defaults, every setting with
    /// its help and default) as TOML.
    Config(Box<ConfigArgs>),
    /// Write a manifest (CSV or JSON lines) of a source to stdout, for `--manifest`.
    Manifest {
        /// The source directory.
        source: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "csv")]
        format: FormatArg,
        /// Add a `label` column from each file's first directory level (ImageFolder layout).
        #[arg(long)]
        label_from_dirs: bool,
    },
    /// Print a plan without mounting: a dataset's mini-epochs, bytes per mini-epoch, per-class
    /// counts and per-node bytes (--manifest / --source), or the paper's bandwidth model
    /// (--dataset-size ... --required-bw ... --tier-bw ...).
    Plan(Box<PlanArgs>),
    /// Write plots (rf per mini-epoch, rf histogram, tier bandwidth) and a summary of a run.
    Report {
        /// The run directory (default of a mount: CACHE/run).
        run_dir: PathBuf,
        /// Where to write the plots and summary [default: RUN_DIR/report].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Unmount, stop the daemon, and keep the cache so that a later mount resumes.
    Umount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Seconds to wait for the daemon to stop.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Show the daemon's state.
    Status {
        #[command(flatten)]
        sock: SocketArg,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Report the end of one pass over the current mini-epoch; prints the decision as JSON.
    PassEnd {
        #[command(flatten)]
        sock: SocketArg,
        /// A metric of the pass, NAME=VALUE (repeatable).
        #[arg(long = "metric", value_name = "NAME=VALUE")]
        metrics: Vec<String>,
        /// Block until the next mini-epoch is staged when the policy wants to advance.
        #[arg(long)]
        block: bool,
        /// Job identity (e.g. the model name).
        #[arg(long)]
        job: Option<String>,
    },
    /// Force an advance to the next mini-epoch.
    Advance {
        #[command(flatten)]
        sock: SocketArg,
        /// Block until the next mini-epoch is staged and the view has switched.
        #[arg(long)]
        wait: bool,
    },
    /// Inspect and manage a dynamic-sharding queue in etcd (`etcd://HOST:PORT/PREFIX`).
    #[command(subcommand)]
    Dds(DdsCmd),
    /// List the current view's files (relative paths), one per line.
    Files {
        #[command(flatten)]
        sock: SocketArg,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DdsCmd {
    /// Show a queue: what it was made for, each epoch's TODO / DOING / DONE shards, and each
    /// node's share of the samples claimed so far and its throughput.
    Status {
        /// The queue: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS).
        url: String,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Make a queue for a dataset before any node mounts (a mount with --dds makes it
    /// otherwise); an existing queue of the same dataset and seed is kept, another refused.
    Init(Box<DdsInitArgs>),
    /// Delete a queue and all its state (refused while nodes hold leases on it, unless --force).
    Reset {
        /// The queue: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS).
        url: String,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Delete even while nodes are working on it.
        #[arg(long)]
        force: bool,
    },
}

/// How to reach etcd: the flags and environment variables `etcdctl` uses.
#[derive(Args, Clone, Default)]
struct EtcdArgs {
    /// CA bundle of the etcd servers' certificates (turns TLS on).
    #[arg(long, env = "ETCDCTL_CACERT")]
    etcd_cacert: Option<PathBuf>,
    /// Client certificate for mutual TLS.
    #[arg(long, env = "ETCDCTL_CERT")]
    etcd_cert: Option<PathBuf>,
    /// Private key of the client certificate.
    #[arg(long, env = "ETCDCTL_KEY")]
    etcd_key: Option<PathBuf>,
    /// etcd user, NAME or NAME:PASSWORD.
    #[arg(long, env = "ETCDCTL_USER")]
    etcd_user: Option<String>,
    /// Password of --etcd-user (better given by the environment than on the command line).
    #[arg(long, env = "ETCDCTL_PASSWORD", hide_env_values = true)]
    etcd_password: Option<String>,
    /// Seconds before a request to etcd fails.
    #[arg(long, default_value_t = 5)]
    etcd_timeout: u64,
}

impl EtcdArgs {
    fn options(&self) -> metfs::dds::EtcdOptions {
        metfs::dds::EtcdOptions {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            password: self.etcd_password.clone(),
            timeout: Duration::from_secs(self.etcd_timeout.max(1)),
        }
    }
}

#[derive(Args)]
struct DdsInitArgs {
    /// The queue: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS).
    url: String,
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Manifest of the dataset (instead of listing --source).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Source directory of the dataset.
    #[arg(long)]
    source: Option<PathBuf>,
    /// Budget of each node's cache (sizes the shards): 512MiB, 20GiB, or bytes.
    #[arg(long)]
    budget: String,
    /// Composition of the shards.
    #[arg(long, alias = "strategy", default_value_t)]
    compose: Strategy,
    /// Seed of the composition.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Shards per slot: more gives finer load balancing, at more etcd round trips.
    #[arg(long, default_value_t = metfs::dds::dataset::SHARDS_PER_SLOT)]
    shards_per_slot: u32,
    /// Label samples by their first directory level.
    #[arg(long)]
    label_from_dirs: bool,
}

#[derive(Args)]
struct SocketArg {
    /// Control socket of the daemon.
    #[arg(long, env = "METFS_SOCKET")]
    socket: PathBuf,
}

#[derive(Args, Clone)]
struct MountArgs {
    /// Where to mount.
    mountpoint: PathBuf,
    /// TOML file with any of the settings below (the environment and flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Stay in the foreground (logs to stderr).
    #[arg(long)]
    foreground: bool,
    /// Discard the saved position (CACHE/state.json) and start at epoch 0. Without it, a saved
    /// position that is corrupt stops the mount with an error naming the bad field.
    #[arg(long)]
    reset: bool,
    /// Internal: pipe on which to report readiness to the parent.
    #[arg(long, hide = true)]
    ready_fd: Option<i32>,
    #[command(flatten)]
    settings: MountSettings,
}

#[derive(Args)]
struct ConfigArgs {
    /// Print every setting with its help and default as a commented TOML file, and nothing
    /// else.
    #[arg(long)]
    defaults: bool,
    /// TOML file with any of the settings below (the environment and flags override it).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: MountSettings,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    Csv,
    Jsonl,
}

#[derive(Args)]
struct PlanArgs {
    /// Model mode: dataset size D, e.g. 8.8TiB.
    #[arg(long)]
    dataset_size: Option<String>,
    /// Model mode: bandwidth the accelerators consume (EB1), e.g. 3.8TiB/s.
    #[arg(long)]
    required_bw: Option<String>,
    /// Model mode: capacity-tier bandwidth (B2), e.g. 400GiB/s.
    #[arg(long)]
    tier_bw: Option<String>,
    /// Model mode: a fixed rf.
    #[arg(long)]
    rf: Option<u32>,
    /// Model mode: a file of per-mini-epoch `rf` and `t` (CSV or JSON lines).
    #[arg(long)]
    rf_schedule: Option<PathBuf>,
    /// Manifest to plan (instead of listing --source).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Source directory to list and plan.
    #[arg(long)]
    source: Option<PathBuf>,
    /// Budget of each node's cache: 512MiB, 20GiB, or bytes.
    #[arg(long)]
    budget: String,
    /// Composition strategy.
    #[arg(long, alias = "strategy", default_value_t)]
    compose: Strategy,
    /// Mini-epochs per epoch [default: the smallest that fits].
    #[arg(long)]
    mini_epochs: Option<u32>,
    /// Seed of the composition.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of nodes.
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// The node whose shares are listed (every node's bytes are summarized).
    #[arg(long, default_value_t = 0)]
    node_rank: u32,
    /// The epoch to plan.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Label samples by their first directory level.
    #[arg(long)]
    label_from_dirs: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The layers of a mount's settings: the file, the environment and the flags given.
fn layers(
    config: Option<&std::path::Path>,
    settings: &MountSettings,
    matches: &clap::ArgMatches,
) -> Result<Layers> {
    let mut layers = Layers::new();
    if let Some(p) = config {
        layers = layers.file(p)?;
    }
    Ok(layers.env(std::env::vars()).flags(settings, |id| {
        matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    })?)
}

fn main() {
    // The matches are kept beside the parsed command: the settings' layers need to know which
    // flags the command line gave (a flag at its default must not override the file).
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = matches
        .subcommand()
        .map(|(_, m)| m.clone())
        .unwrap_or_default();
    if !matches!(cli.cmd, Cmd::Mount(_)) {
        // A command that prints (`files`, `plan`, `manifest`, `status`) into a pipe closed early
        // (`| head`) ends quietly, as Unix tools do, instead of panicking on EPIPE. The daemon
        // (`mount`) keeps SIGPIPE ignored: a client hanging up must never kill it.
        // SAFETY: restoring a signal's default disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let code = match run(cli, &sub) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("metfs: {}", message(&e));
            1
        }
    };
    std::process::exit(code);
}

/// An error and its causes, `: `-separated, each said once: many of the modules' messages
/// already include their source's text (`manifest FILE: No such file`), which `{:#}` would
/// print again.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

fn run(cli: Cli, sub: &clap::ArgMatches) -> Result<()> {
    match cli.cmd {
        Cmd::Mount(args) => mount_cmd(*args, sub),
        Cmd::Config(args) => {
            if args.defaults {
                print!("{}", reference::defaults_toml());
            } else {
                let layers = layers(args.config.as_deref(), &args.settings, sub)?;
                MountConfig::resolve(&layers)?;
                print!("{}", reference::effective_toml(&layers)?);
            }
            Ok(())
        }
        Cmd::Manifest {
            source,
            format,
            label_from_dirs,
        } => manifest_cmd(&source, format, label_from_dirs),
        Cmd::Plan(args) => plan_cmd(*args),
        Cmd::Dds(cmd) => dds_cmd(cmd),
        Cmd::Report { run_dir, out, json } => {
            let out = out.unwrap_or_else(|| run_dir.join("report"));
            let s = report::report(&run_dir, &out)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", report::summary_text(&s));
                println!("plots and summary in {}", out.display());
            }
            Ok(())
        }
        Cmd::Umount {
            mountpoint,
            timeout,
        } => {
            mount::umount(&mountpoint, Duration::from_secs(timeout))?;
            Ok(())
        }
        Cmd::Status { sock, json } => {
            let st: Status = client::request(&sock.socket, &Request::Status)?;
            if json {
                println!("{}", serde_json::to_string(&Reply::new(st))?);
            } else {
                print_status(&st);
            }
            Ok(())
        }
        Cmd::PassEnd {
            sock,
            metrics,
            block,
            job,
        } => {
            let metrics = metrics
                .iter()
                .map(|kv| parse_metric(kv))
                .collect::<Result<_>>()?;
            let d: Decision = client::request(
                &sock.socket,
                &Request::PassEnd {
                    job,
                    metrics,
                    block,
                },
            )?;
            println!("{}", serde_json::to_string(&Reply::new(d))?);
            Ok(())
        }
        Cmd::Advance { sock, wait } => {
            let d: Decision = client::request(&sock.socket, &Request::Advance { wait })?;
            println!("{}", serde_json::to_string(&Reply::new(d))?);
            Ok(())
        }
        Cmd::Files { sock, json } => {
            let view: FilesView = client::request(&sock.socket, &Request::Files)?;
            if json {
                println!("{}", serde_json::to_string(&Reply::new(view))?);
            } else {
                for f in &view.files {
                    println!("{f}");
                }
            }
            Ok(())
        }
    }
}

/// A `--metric NAME=VALUE`: a non-empty name and a finite number. NaN and infinities are
/// refused here, naming the metric: JSON has no such numbers, and the protocol carries finite
/// metrics only (a diverged loss is for the job to handle, not for the rf policy to score).
fn parse_metric(kv: &str) -> Result<(String, f64)> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| anyhow!("--metric `{kv}`: expected NAME=VALUE"))?;
    let k = k.trim();
    if k.is_empty() {
        anyhow::bail!("--metric `{kv}`: the metric has no name; expected NAME=VALUE");
    }
    let x: f64 = v
        .trim()
        .parse()
        .map_err(|_| anyhow!("--metric `{kv}`: `{v}` is not a number"))?;
    if !x.is_finite() {
        anyhow::bail!(
            "--metric `{kv}`: metric `{k}` is {}; only finite numbers are accepted",
            if x.is_nan() { "NaN" } else { "infinite" }
        );
    }
    Ok((k.to_string(), x))
}

fn manifest_cmd(source: &std::path::Path, format: FormatArg, labels: bool) -> Result<()> {
    use prefetcher::tier::CapacityTier;
    let tier = prefetcher::tier::PosixTier::new(source)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listing = rt.block_on(tier.list())?;
    for (p, why) in &listing.skipped {
        eprintln!("metfs: not listed: {p}: {why}");
    }
    let mut cat = prefetcher::catalog::Catalog::from_entries(tier.url(), listing.entries)?;
    if labels {
        cat.label_by_first_dir();
    }
    let format = match format {
        FormatArg::Csv => prefetcher::manifest::ManifestFormat::Csv,
        FormatArg::Jsonl => prefetcher::manifest::ManifestFormat::Jsonl,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    prefetcher::manifest::write_manifest(&cat, &mut out, format)?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

fn model_cmd(a: &PlanArgs, dataset: &str) -> Result<()> {
    use prefetcher::model::{model, read_schedule, ModelInputs, RfSpec};
    use prefetcher::size::{parse_rate, parse_size};
    let need = |v: &Option<String>, flag: &str| {
        v.clone()
            .ok_or_else(|| anyhow!("model mode needs {flag} (with --dataset-size)"))
    };
    let inputs = ModelInputs {
        dataset_bytes: parse_size(dataset).context("--dataset-size")?,
        budget_bytes: parse_size(&a.budget).context("--budget")?,
        required_bytes_per_s: parse_rate(&need(&a.required_bw, "--required-bw")?)
            .context("--required-bw")? as f64,
        tier_bytes_per_s: parse_rate(&need(&a.tier_bw, "--tier-bw")?).context("--tier-bw")? as f64,
        mini_epochs: a.mini_epochs,
        rf: match (a.rf, &a.rf_schedule) {
            (Some(n), None) => RfSpec::Fixed(n),
            (None, Some(p)) => RfSpec::Schedule(read_schedule(p)?),
            _ => anyhow::bail!("model mode needs exactly one of --rf N or --rf-schedule FILE"),
        },
    };
    let out = model(&inputs)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{out}");
    }
    Ok(())
}

/// The catalog of --manifest or --source (labelled as a mount would label it) and the budget
/// split a mount of it would use.
fn plan_catalog(
    manifest: Option<&std::path::Path>,
    source: Option<&std::path::Path>,
    strategy: Strategy,
    label_from_dirs: bool,
    budget: u64,
) -> Result<(prefetcher::catalog::Catalog, prefetcher::budget::Budget)> {
    let mut cat = match (manifest, source) {
        (Some(m), None) => prefetcher::manifest::load_catalog(m)?,
        (None, Some(src)) => {
            use prefetcher::tier::CapacityTier;
            let tier = prefetcher::tier::PosixTier::new(src)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let l = rt.block_on(tier.list())?;
            prefetcher::catalog::Catalog::from_entries(tier.url(), l.entries)?
        }
        _ => anyhow::bail!("give exactly one of --manifest FILE or --source DIR"),
    };
    if label_from_dirs || (strategy == Strategy::Stratified && cat.labels().is_none()) {
        cat.label_by_first_dir();
    }
    // The daemon saves the catalog in the cache; its size is estimated here without writing it.
    let names: u64 = (0..cat.len() as u32)
        .map(|i| cat.dir_and_name(i).1.len() as u64)
        .sum();
    let catalog_bytes = names + 24 * cat.len() as u64;
    let b = prefetcher::budget::Budget::new(budget, &cat, catalog_bytes, logging::LOG_RESERVE)?;
    Ok((cat, b))
}

fn dds_cmd(cmd: DdsCmd) -> Result<()> {
    use metfs::dds::{dataset, DdsUrl, Queue};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cmd {
        DdsCmd::Status { url, etcd, json } => {
            let url = DdsUrl::parse(&url)?;
            let st = rt.block_on(async {
                let q = Queue::connect(&url, &etcd.options()).await?;
                q.status().await
            })?;
            if json {
                println!("{}", serde_json::to_string(&st)?);
            } else {
                print_dds_status(&st);
            }
        }
        DdsCmd::Init(a) => {
            let url = DdsUrl::parse(&a.url)?;
            let budget = prefetcher::size::parse_size(&a.budget).context("--budget")?;
            let strategy = a.compose;
            let (cat, b) = plan_catalog(
                a.manifest.as_deref(),
                a.source.as_deref(),
                strategy,
                a.label_from_dirs,
                budget,
            )?;
            let footprints = cat
                .sizes()
                .iter()
                .map(|&s| prefetcher::budget::round_up(s))
                .collect();
            let samples = dataset::samples(&cat, footprints);
            let meta = dataset::queue_meta(
                &cat,
                &samples,
                strategy,
                a.seed,
                b.slot_bytes,
                a.shards_per_slot,
            )?;
            let (m, made) = rt.block_on(async {
                let q = Queue::connect(&url, &a.etcd.options()).await?;
                q.init(&meta).await
            })?;
            println!(
                "{} {url}: dataset {} ({} samples), seed {}, {}, {} shards of at most {}",
                if made { "made" } else { "kept" },
                m.fingerprint,
                m.samples,
                m.seed,
                m.strategy,
                m.shards,
                prefetcher::size::format_bytes(m.shard_bytes)
            );
        }
        DdsCmd::Reset { url, etcd, force } => {
            let url = DdsUrl::parse(&url)?;
            let n = rt.block_on(async {
                let q = Queue::connect(&url, &etcd.options()).await?;
                q.reset(force).await
            })?;
            println!("reset {url}: {n} keys deleted");
        }
    }
    Ok(())
}

fn print_dds_status(st: &metfs::dds::QueueStatus) {
    let m = &st.meta;
    println!(
        "queue {}: dataset {} ({} samples), seed {}, {}, {} shards of at most {}",
        st.url,
        m.fingerprint,
        m.samples,
        m.seed,
        m.strategy,
        m.shards,
        prefetcher::size::format_bytes(m.shard_bytes)
    );
    if st.epochs.is_empty() {
        println!("no epoch started");
    }
    for e in &st.epochs {
        println!(
            "epoch {}: {} done, {} doing, {} todo",
            e.epoch, e.done, e.doing, e.todo
        );
    }
    if !st.nodes.is_empty() {
        println!(
            "{:<20} {:>6} {:>6} {:>10} {:>7} {:>10} {:>6} {:>10}",
            "node", "live", "doing", "claimed", "share", "done", "lost", "samples/s"
        );
    }
    for n in &st.nodes {
        println!(
            "{:<20} {:>6} {:>6} {:>10} {:>6.1}% {:>10} {:>6} {:>10.1}",
            n.node,
            n.live.map_or("-".to_string(), |i| format!("#{i}")),
            n.doing,
            n.stats.claimed_samples,
            n.share * 100.0,
            n.stats.done_samples,
            n.stats.lost_shards,
            n.throughput
        );
    }
}

fn plan_cmd(a: PlanArgs) -> Result<()> {
    use prefetcher::planner::{summarize, PlanConfig, SampleSet};
    if let Some(d) = a.dataset_size.clone() {
        return model_cmd(&a, &d);
    }
    let budget = prefetcher::size::parse_size(&a.budget).context("--budget")?;
    let strategy = a.compose;
    let (cat, b) = plan_catalog(
        a.manifest.as_deref(),
        a.source.as_deref(),
        strategy,
        a.label_from_dirs,
        budget,
    )?;
    let footprints: Vec<u64> = cat
        .sizes()
        .iter()
        .map(|&s| prefetcher::budget::round_up(s))
        .collect();
    let set = SampleSet {
        sizes: &footprints,
        labels: cat.labels(),
        clusters: cat.clusters(),
    };
    let cfg = PlanConfig {
        strategy,
        seed: a.seed,
        slot_bytes: b.slot_bytes,
        mini_epochs: a.mini_epochs,
        node_rank: a.node_rank,
        nodes: a.nodes,
    };
    let names: Option<Vec<String>> = match strategy {
        Strategy::Clustered => cat.clusters().map(|c| {
            let n = c.iter().copied().max().map_or(0, |m| m + 1);
            (0..n).map(|i| cat.cluster_name(i).to_string()).collect()
        }),
        _ => cat.labels().map(|_| {
            (0..cat.label_count() as u32)
                .map(|i| cat.label_name(i).to_string())
                .collect()
        }),
    };
    let summary = summarize(&set, &cfg, a.epoch, names.as_deref()).map_err(|e| match e {
        prefetcher::planner::PlanError::SampleTooLarge { sample, size, .. } => anyhow!(
            "budget {} is too small: `{}` takes {}, so the budget must be at least {}",
            prefetcher::size::format_bytes(budget),
            cat.path(sample),
            prefetcher::size::format_bytes(size),
            prefetcher::size::format_bytes(size.saturating_mul(2).saturating_add(b.reserve))
        ),
        e => e.into(),
    })?;
    /// What `metfs plan` prints: the plan's summary and the budget and dataset it is for.
    #[derive(serde::Serialize)]
    struct PlanOutput<S> {
        #[serde(flatten)]
        summary: S,
        budget_bytes: u64,
        slot_bytes: u64,
        reserve_bytes: u64,
        dataset_files: usize,
        dataset_bytes: u64,
    }
    let v = PlanOutput {
        summary,
        budget_bytes: budget,
        slot_bytes: b.slot_bytes,
        reserve_bytes: b.reserve,
        dataset_files: cat.len(),
        dataset_bytes: cat.total_bytes(),
    };
    if a.json {
        let v = serde_json::to_string(&v)?;
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

fn print_status(st: &Status) {
    let b = prefetcher::size::format_bytes;
    println!(
        "epoch {} mini-epoch {}/{}  pass {} (rf {} {})  generation {}",
        st.epoch, st.mini_epoch, st.mini_epochs, st.pass, st.rf, st.rf_policy, st.generation
    );
    let next = match &st.staging {
        Staging::Idle => "idle",
        Staging::Draining => "draining",
        Staging::Staging { .. } => "staging",
        Staging::Ready { .. } => "ready",
        Staging::Failed { .. } => "failed",
    };
    println!(
        "view: {} files, {}   next: {next}{}",
        st.view_files,
        b(st.view_bytes),
        if st.next_ready { " (ready)" } else { "" }
    );
    println!(
        "cache: {} of {}   tier read: {}   read path: {}",
        b(st.cache_bytes),
        b(st.budget_bytes),
        b(st.tier_bytes_read),
        st.read_path
    );
    if let Some(e) = &st.last_error {
        println!("last error: {e}");
    }
}

fn mount_cmd(args: MountArgs, sub: &clap::ArgMatches) -> Result<()> {
    let mut cfg = MountConfig::resolve(&layers(args.config.as_deref(), &args.settings, sub)?)?;
    cfg.reset = args.reset;
    let mountpoint = mount::absolute(&args.mountpoint);
    daemon::check_places(&cfg, &mountpoint)?;
    if !args.foreground {
        // Check what can be checked before forking so that errors come back directly.
        mount::check_mountpoint(&mountpoint)?;
        let mut child_args: Vec<OsString> = std::env::args_os().skip(1).collect();
        child_args.retain(|a| a != "--foreground");
        logging::rotate(&cfg.log_file);
        let pid = mount::spawn_background(&child_args, &cfg.log_file)?;
        eprintln!(
            "metfs: mounted {} (daemon pid {pid}, socket {}, log {})",
            mountpoint.display(),
            cfg.socket.display(),
            cfg.log_file.display()
        );
        return Ok(());
    }
    logging::init(args.ready_fd.is_some().then_some(&cfg.log_file));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_daemon(cfg, mountpoint, args.ready_fd))
}

async fn run_daemon(cfg: MountConfig, mountpoint: PathBuf, ready_fd: Option<i32>) -> Result<()> {
    // Staging and the read paths keep many files open; an ordinary user's session starts
    // with a soft limit of 1,024 descriptors.
    metfs::fs::raise_fd_limit();
    let setup = async {
        mount::check_mountpoint(&mountpoint)?;
        mount::check_fuse_device()?;
        let show_progress =
            ready_fd.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let (daemon, lock) = daemon::Daemon::prepare(cfg, show_progress)
            .await
            .context("preparing the mount")?;
        let listener = control::bind(&daemon.cfg.socket)
            .with_context(|| format!("control socket {}", daemon.cfg.socket.display()))?;
        let fs = daemon.fs();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        fs.set_drained_sender(tx);
        let adapter = fuse::FuseAdapter::new(fs, daemon.active_read_path());
        let mut fcfg = fuser::Config::default();
        fcfg.mount_options = vec![
            fuser::MountOption::FSName("metfs".into()),
            fuser::MountOption::Subtype("metfs".into()),
            fuser::MountOption::RO,
            fuser::MountOption::NoSuid,
            fuser::MountOption::NoDev,
        ];
        if daemon.cfg.allow_other {
            fcfg.acl = fuser::SessionACL::All;
            // Other users get what the source's modes and owners allow them, enforced by the
            // kernel on the attributes the view reports (the source's, write bits cleared).
            fcfg.mount_options
                .push(fuser::MountOption::DefaultPermissions);
        }
        fcfg.n_threads = Some(daemon.cfg.fuse_threads);
        fcfg.clone_fd = true;
        let mp = mountpoint.clone();
        let (session, notifier) = tokio::task::spawn_blocking(move || {
            let s = fuser::Session::new(adapter, &mp, &fcfg)?;
            let notifier = fuse::KernelNotifier::new(&s);
            s.spawn().map(|s| (s, notifier))
        })
        .await?
        .with_context(|| format!("mounting FUSE on {}", mountpoint.display()))?;
        daemon.mounted(&mountpoint, notifier);
        mount::register(&mount::Registered {
            mountpoint: mountpoint.clone(),
            socket: daemon.cfg.socket.clone(),
            pid: std::process::id(),
            cache: daemon.cfg.cache.clone(),
        })
        .context("writing the mount registry")?;
        tokio::spawn(control::serve(listener, daemon.clone()));
        tokio::spawn(daemon.clone().stager_loop());
        tokio::spawn(daemon.clone().drain_loop(rx));
        tokio::spawn(daemon.clone().monitor_loop());
        anyhow::Ok((daemon, session, lock))
    };
    let (daemon, session, _lock) = match setup.await {
        Ok(x) => x,
        Err(e) => {
            tracing::error!("{}", message(&e));
            mount::signal_ready(ready_fd, Err(message(&e)));
            return Err(e);
        }
    };
    tracing::info!(
        mountpoint = %mountpoint.display(),
        socket = %daemon.cfg.socket.display(),
        read_path = match daemon.read_path() {
            ReadPath::Passthrough => "passthrough (falls back to pread if the kernel refuses)",
            other => other.name(),
        },
        "mounted"
    );
    mount::signal_ready(ready_fd, Ok(()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = daemon.shutdown.notified() => {}
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
    shutdown(daemon, session, &mountpoint).await;
    Ok(())
}

async fn shutdown(
    daemon: Arc<daemon::Daemon>,
    session: fuser::BackgroundSession,
    mp: &std::path::Path,
) {
    tracing::info!("shutting down; the cache is kept for a later mount");
    daemon.begin_shutdown();
    daemon.persist();
    let _ = std::fs::remove_file(&daemon.cfg.socket);
    mount::unregister(mp);
    let mp2 = mp.to_path_buf();
    // An unmount with files still open fails with EBUSY; then detach lazily: the kernel
    // finishes the unmount when the last file closes, and our exit closes /dev/fuse.
    let joined = tokio::task::spawn_blocking(move || session.umount_and_join()).await;
    if !matches!(joined, Ok(Ok(()))) {
        let c = std::ffi::CString::new(mp2.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    tracing::info!("unmounted");
}
