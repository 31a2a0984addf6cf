//! `metfs mount`: resolve the settings, fork the daemon, mount FUSE over it and serve until
//! unmounted or signalled.

use super::{layers, message};
use anyhow::{Context, Result};
use clap::Args;
use metfs::config::{MountConfig, MountSettings, ReadPath};
use metfs::{control, daemon, logging, mount};
use metfs_fs::fuse;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Clone)]
pub(super) struct MountArgs {
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
    /// Root only: run the daemon as USER (a name or uid), keeping of root only what FUSE
    /// passthrough needs (CAP_SYS_ADMIN), so that the user's reads take passthrough while the
    /// tier is read with the user's own rights. For a node service that mounts for a job's
    /// user (deploy/slurm/prolog.sh); the cache and the mountpoint's directory must be the
    /// user's.
    #[arg(long, value_name = "USER")]
    run_as: Option<String>,
    /// Internal: pipe on which to report readiness to the parent.
    #[arg(long, hide = true)]
    ready_fd: Option<i32>,
    #[command(flatten)]
    settings: MountSettings,
}

pub(super) fn mount_cmd(args: MountArgs, sub: &clap::ArgMatches) -> Result<()> {
    // Before anything reads a file or starts a thread (see `metfs::runas`): the settings, the
    // places and the log are then checked and opened as the user.
    if let Some(user) = &args.run_as {
        if args.ready_fd.is_some() {
            // The background daemon: its parent became the user before the exec.
            metfs::runas::drop_ambient(user)?;
        } else {
            let u = metfs::runas::become_user(user, !args.foreground)?;
            if args.foreground {
                metfs::runas::drop_ambient(&u.name)?;
            }
        }
    }
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
    mount::keep_ready_fd_private(args.ready_fd);
    logging::init(args.ready_fd.is_some().then_some(&cfg.log_file));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = rt.block_on(run_daemon(cfg, mountpoint, args.ready_fd));
    // Dropping the runtime would wait for every blocking task still running, however long:
    // a slot deletion or a staging's reads of 500k files kept an unmounted daemon alive for
    // minutes, deaf to SIGTERM (its handler is the runtime's). Each such task is resumable,
    // as after a kill: the next start deletes what is left of a slot and resumes a staging
    // from its journal. The slot deletion stops by itself at the shutdown; this bounds the
    // rest.
    rt.shutdown_timeout(SHUTDOWN_GRACE);
    outcome
}

/// How long the exit waits for blocking tasks still running after the daemon has shut down.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

async fn run_daemon(cfg: MountConfig, mountpoint: PathBuf, ready_fd: Option<i32>) -> Result<()> {
    // Staging and the read paths keep many files open; an ordinary user's session starts
    // with a soft limit of 1,024 descriptors.
    metfs_fs::fs::raise_fd_limit();
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
        let fs = daemon.surface().fs();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        fs.set_drained_sender(tx);
        let mut adapter = fuse::FuseAdapter::new(fs, daemon.surface().active_read_path());
        let ended = Arc::new(tokio::sync::Notify::new());
        let on_end = ended.clone();
        adapter.on_session_end(move || on_end.notify_one());
        let splice = adapter.splice_replies();
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
        // Every FUSE thread reads the session's one descriptor: a spliced reply must be written
        // on the descriptor that read its request (see `fuse::splice`).
        fcfg.clone_fd = false;
        let mp = mountpoint.clone();
        let (session, notifier) = tokio::task::spawn_blocking(move || {
            let s = fuser::Session::new(adapter, &mp, &fcfg)?;
            if let Err(e) = splice.start(&s) {
                tracing::warn!(error = %e, "read replies are copied, not spliced");
            }
            let notifier = fuse::KernelNotifier::new(&s);
            s.spawn().map(|s| (s, notifier))
        })
        .await?
        .with_context(|| format!("mounting FUSE on {}", mountpoint.display()))?;
        daemon.surface().mounted(&mountpoint, notifier);
        daemon.prime_all();
        mount::register(&mount::Registered {
            mountpoint: mountpoint.clone(),
            socket: daemon.cfg.socket.clone(),
            pid: std::process::id(),
            cache: daemon.cfg.cache.clone(),
        })
        .context("writing the mount registry")?;
        tokio::spawn(control::serve(listener, daemon.clone()));
        daemon.start_tasks(rx);
        anyhow::Ok((daemon, session, lock, ended))
    };
    let (daemon, session, _lock, ended) = match setup.await {
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
        read_path = match daemon.surface().read_path() {
            ReadPath::Passthrough => "passthrough (falls back to pread if the kernel refuses)",
            other => other.name(),
        },
        "mounted"
    );
    mount::signal_ready(ready_fd, Ok(()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut unmounted = false;
    tokio::select! {
        _ = daemon.life().shutdown_requested() => {}
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
        _ = ended.notified() => {
            tracing::warn!("unmounted from outside (umount or fusermount3 -u)");
            unmounted = true;
        }
    }
    shutdown(daemon, session, &mountpoint, unmounted).await;
    Ok(())
}

/// Ends the daemon. `unmounted`: the kernel has already ended the session (an unmount from
/// outside), so there is nothing to unmount.
async fn shutdown(
    daemon: Arc<daemon::Daemon>,
    mut session: fuser::BackgroundSession,
    mp: &std::path::Path,
    unmounted: bool,
) {
    tracing::info!("shutting down; the cache is kept for a later mount");
    daemon.life().begin_shutdown();
    daemon.persist();
    let d = daemon.clone();
    let _ = tokio::task::spawn_blocking(move || d.store().seal_slots()).await;
    // The run's last events (written by the log's own thread) reach the file before the exit.
    daemon.events.close(std::time::Duration::from_secs(5));
    let _ = std::fs::remove_file(&daemon.cfg.socket);
    mount::unregister(mp);
    if unmounted {
        // The mountpoint may already hold another mount, which the session's own unmount (on
        // join or drop) would take away: only the session's thread is joined, and the session
        // is let go without its drop.
        let guard = std::mem::replace(&mut session.guard, std::thread::spawn(|| Ok(())));
        std::mem::forget(session);
        let _ = tokio::task::spawn_blocking(move || guard.join()).await;
        tracing::info!("session ended");
        return;
    }
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
