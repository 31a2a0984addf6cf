//! `metfs doctor`: the mount's settings, read as `metfs mount` reads them, checked against this
//! node for the user who runs it (`metfs::doctor`). Exit status 0 when a mount would work, 1
//! when a check fails, 2 for bad input (the same errors as `metfs mount`).

use super::{layers, message};
use clap::Args;
use metfs::config::{MountConfig, MountSettings};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Clone)]
pub(super) struct DoctorArgs {
    /// TOML file with any of the settings below (the environment and flags override it), as
    /// for `metfs mount`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print one JSON object: {"version", "uid", "user", "ok", "checks": [{"name", "status",
    /// "found", "fix"}]}.
    #[arg(long)]
    json: bool,
    /// The Python whose `metfs` package must match this binary's version.
    #[arg(long, value_name = "PATH", default_value = "python3")]
    python: PathBuf,
    /// Seconds the tier's listing and the Python check may take, each.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    timeout: u64,
    /// Accepted and ignored, so that the flags of a `metfs mount` command line can be given
    /// unchanged.
    #[arg(long, hide = true)]
    reset: bool,
    #[command(flatten)]
    settings: MountSettings,
}

/// Runs the checks and prints them; returns the exit status.
pub(super) fn doctor_cmd(args: DoctorArgs, sub: &clap::ArgMatches) -> i32 {
    let target = layers(args.config.as_deref(), &args.settings, sub)
        .and_then(|l| Ok(MountConfig::resolve(&l)?))
        .and_then(|cfg| Ok(metfs::doctor::Target::new(cfg)?));
    let target = match target {
        Ok(t) => t,
        Err(e) => {
            eprintln!("metfs: {}", message(&e));
            return 2;
        }
    };
    let opts = metfs::doctor::Options {
        python: args.python,
        timeout: Duration::from_secs(args.timeout.max(1)),
        ..Default::default()
    };
    let report = metfs::doctor::run(&target, &opts);
    if args.json {
        match serde_json::to_string(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("metfs: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", report.text());
    }
    report.exit_code()
}
