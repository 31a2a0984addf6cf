//! `metfs`: mini-epoch training over FUSE.
//!
//! The binary is a thin CLI (clap) over the library: this file declares the commands and
//! dispatches them; `serve` runs a mount, `doctor` checks a node for one, `catalog` writes the
//! catalog file every node mounts from, `plan` and `dds` the commands that work without one.
//! `anyhow` is used only in the binary, to add context to the modules' typed errors on their way
//! to the user.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::{Args, CommandFactory, FromArgMatches, Subcommand};

use metfs::config::{reference, Layers, MountConfig, MountSettings};
use metfs::{client, mount};
use metfs_protocol::{Decision, FilesView, Reply, Request, Staging, Status};

mod catalog;
mod dds;
mod doctor;
mod plan;
mod serve;

use catalog::{catalog_cmd, CatalogArgs};
use dds::{dds_cmd, DdsCmd};
use doctor::{doctor_cmd, DoctorArgs};
use plan::{manifest_cmd, plan_cmd, FormatArg, PlanArgs};
use serve::{mount_cmd, MountArgs};

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
    /// Check whether this node can run a mount of these settings as this user: FUSE in the
    /// kernel, fusermount3, /dev/fuse, passthrough, the cache's file system and free space
    /// against the budget, the tier's listing, the Python package's version. Each check
    /// prints ok, warn or FAIL with what fixes it; exit status 0 when a mount would work, 1
    /// when a check fails, 2 for bad input.
    Doctor(Box<DoctorArgs>),
    /// Write the catalog of a source to a file once (listing it, or reading its manifest),
    /// for every node of a job to mount from with `--catalog FILE` without listing the tier.
    /// Takes the settings of `metfs mount` (S3, manifest, labels); keeps a FILE that is still
    /// a current catalog of the source unless --fresh.
    Catalog(Box<CatalogArgs>),
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
    /// Draw named curves (a benchmark's results) from a JSON document as a PNG: {"title",
    /// "x_label", "y_label", "series": [{"name", "points": [[x, y], ...]}], "hlines": [{"y",
    /// "label"}]}.
    Plot {
        /// The curves document (JSON).
        curves: PathBuf,
        /// The PNG to write.
        out: PathBuf,
    },
    /// Unmount, stop the daemon, and keep the cache so that a later mount resumes.
    Umount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Seconds to wait for the daemon to stop.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Show the daemon's state (on a shared mount: every job, or one with --job).
    Status {
        #[command(flatten)]
        sock: SocketArg,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// On a shared mount (--share): the job whose position to show.
        #[arg(long)]
        job: Option<String>,
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
        /// The elapsed fraction of the job's run, in [0, 1] (the `paced` policy's cap grows
        /// with it).
        #[arg(long)]
        progress: Option<f64>,
        /// The fresh-data loss: the loss of the first batches of this mini-epoch's first pass,
        /// computed before they were trained on.
        #[arg(long)]
        fresh_loss: Option<f64>,
    },
    /// Force an advance to the next mini-epoch.
    Advance {
        #[command(flatten)]
        sock: SocketArg,
        /// Block until the next mini-epoch is staged and the view has switched.
        #[arg(long)]
        wait: bool,
        /// On a shared mount (--share): the job.
        #[arg(long)]
        job: Option<String>,
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
        /// On a shared mount (--share): the job whose view to list.
        #[arg(long)]
        job: Option<String>,
    },
}

#[derive(Args)]
struct SocketArg {
    /// Control socket of the daemon.
    #[arg(long, env = "METFS_SOCKET")]
    socket: PathBuf,
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
    let code = match cli.cmd {
        // Its own exit statuses: 1 for a failed check, 2 for bad input.
        Cmd::Doctor(args) => doctor_cmd(*args, &sub),
        cmd => match run(Cli { cmd }, &sub) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("metfs: {}", message(&e));
                1
            }
        },
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
        Cmd::Doctor(_) => unreachable!("dispatched in main"),
        Cmd::Catalog(args) => catalog_cmd(*args, sub),
        Cmd::Manifest {
            source,
            format,
            label_from_dirs,
        } => manifest_cmd(&source, format, label_from_dirs),
        Cmd::Plan(args) => plan_cmd(*args),
        Cmd::Dds(cmd) => dds_cmd(cmd),
        Cmd::Report { run_dir, out, json } => {
            let out = out.unwrap_or_else(|| run_dir.join("report"));
            let s = metfs_report::report(&run_dir, &out)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", metfs_report::summary_text(&s));
                println!("plots and summary in {}", out.display());
            }
            Ok(())
        }
        Cmd::Plot { curves, out } => {
            metfs_report::plot_curves(&curves, &out)?;
            println!("{}", out.display());
            Ok(())
        }
        Cmd::Umount {
            mountpoint,
            timeout,
        } => {
            mount::umount(&mountpoint, Duration::from_secs(timeout))?;
            Ok(())
        }
        Cmd::Status { sock, json, job } => {
            let st: Status = client::request(&sock.socket, &Request::Status { job })?;
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
            progress,
            fresh_loss,
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
                    progress,
                    fresh_loss,
                },
            )?;
            println!("{}", serde_json::to_string(&Reply::new(d))?);
            Ok(())
        }
        Cmd::Advance { sock, wait, job } => {
            let d: Decision = client::request(&sock.socket, &Request::Advance { wait, job })?;
            println!("{}", serde_json::to_string(&Reply::new(d))?);
            Ok(())
        }
        Cmd::Files { sock, json, job } => files_cmd(&sock.socket, json, job),
    }
}

/// `metfs files`: the view's files, one per line, or its JSON reply.
fn files_cmd(socket: &std::path::Path, json: bool, job: Option<String>) -> Result<()> {
    let view: FilesView = client::files(socket, job)?;
    if json {
        println!("{}", serde_json::to_string(&Reply::new(view))?);
    } else {
        // One buffered writer: `println!` takes the stdout lock and may write once per
        // line, which is most of the time for a view of 500,000 files.
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for f in &view.files {
            writeln!(out, "{f}")?;
        }
        out.flush()?;
    }
    Ok(())
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

fn print_status(st: &Status) {
    let b = metfs_plan::size::format_bytes;
    println!(
        "epoch {} mini-epoch {}/{}  pass {} (rf {} {})  generation {}",
        st.epoch,
        st.mini_epoch,
        st.mini_epochs,
        st.pass,
        st.rf,
        st.rf_policy.map_or("", |k| k.as_str()),
        st.generation
    );
    if let Some(r) = &st.replay {
        println!("replaying {r}");
    }
    // A restarted shared mount that could not resume a job says so here too, not only in the
    // job's next hello.
    for n in st.not_resumed.iter().flatten() {
        println!(
            "job {} not resumed (it starts over at epoch 0; saved at epoch {} mini-epoch {} pass {}): {}",
            n.job, n.epoch, n.mini_epoch, n.passes, n.reason
        );
    }
    // Bonus passes make the rf a job gets differ from the policy's: say so beside it.
    if st.effective_rf.is_some() || st.mini_epoch_bonus_passes > 0 {
        let done = st
            .effective_rf
            .map_or("no mini-epoch completed".into(), |e| {
                format!(
                    "{e:.2} over {} mini-epoch(s) (last {}), {} raised by bonus passes",
                    st.completed_mini_epochs,
                    st.last_rf.unwrap_or(0),
                    st.stalled_mini_epochs
                )
            });
        println!(
            "effective rf: {done}; this mini-epoch: {} bonus pass(es) so far{}",
            st.mini_epoch_bonus_passes,
            st.stall_free_rf
                .map_or(String::new(), |r| format!("; stall-free rf {r}"))
        );
    }
    let next = match &st.staging {
        Staging::Idle => "idle",
        Staging::Draining => "draining",
        Staging::Staging { .. } => "staging",
        Staging::Ready { .. } => "ready",
        Staging::Failed { defers: false, .. } => "failed",
        Staging::Failed { defers: true, .. } => {
            "failed; the next try defers the samples the tier keeps failing on"
        }
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
    if st.deferred_samples > 0 || st.deferrals > 0 {
        println!(
            "deferred: {} sample(s) carried to a later mini-epoch, {} deferral(s), {} recovered",
            st.deferred_samples, st.deferrals, st.recovered_samples
        );
    }
    print_modes(st);
    if let Some(e) = &st.last_error {
        println!("last error: {e}");
    }
}

/// `metfs status`'s lines of a queue node or a shared store.
fn print_modes(st: &Status) {
    let b = metfs_plan::size::format_bytes;
    if let Some(d) = &st.dds {
        println!(
            "queue: {} as node {} (incarnation {}), epoch {}: {} shards / {} samples claimed, {} / {} done, {} lost, {:.1} samples/s{}",
            d.url,
            d.node,
            d.incarnation,
            d.epoch,
            d.claimed_shards,
            d.claimed_samples,
            d.done_shards,
            d.done_samples,
            d.lost_shards,
            d.samples_per_sec,
            if d.finished { ", every shard done" } else { "" }
        );
        if let Some(e) = &d.last_error {
            println!("queue error: {e}");
        }
    }
    if let Some(jobs) = &st.jobs {
        println!("shared store: {} job(s)", jobs.len());
        for j in jobs {
            println!(
                "  {}: epoch {} view {} pass {} (rf {} {})  {} files, {}  {} samples, share {}  next: {}{}  idle {:.0} s",
                j.name,
                j.epoch,
                j.mini_epoch
                    .map_or("none yet (joining)".to_string(), |m| m.to_string()),
                j.pass,
                j.rf,
                j.rf_policy,
                j.files,
                b(j.view_bytes),
                j.samples,
                b(j.share_bytes),
                if j.next_ready { "ready" } else { "not ready" },
                if j.held_back { " (held back for a slower job)" } else { "" },
                j.idle_secs
            );
        }
    }
}
