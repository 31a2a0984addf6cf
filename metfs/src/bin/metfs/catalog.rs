//! `metfs catalog`: the catalog of a source written once to a file (`metfs::daemon::
//! make_catalog_file`), from which every node of a job mounts with `--catalog FILE` instead of
//! listing the tier. The settings are read as `metfs mount` reads them (the same config file,
//! environment and flags: S3 endpoint, region and credentials, manifest, labels); the cache and
//! the budget, which a catalog does not need, may be left out.

use anyhow::{anyhow, Context, Result};
use clap::Args;
use metfs::config::{Layers, MountConfig, MountSettings};
use metfs::daemon;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub(super) struct CatalogArgs {
    /// The source to catalogue (as --source; or from the config file or METFS_SOURCE).
    #[arg(value_name = "SOURCE", id = "source_arg")]
    dataset: Option<String>,
    /// The catalog file to write [default: the `catalog` setting (METFS_CATALOG, or `catalog`
    /// in the config file)].
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// List the source even when FILE already holds a current catalog of it (by default such
    /// a file is kept: one stat per directory, or one listing of an object store, tells).
    #[arg(long)]
    fresh: bool,
    /// TOML file with any of the settings below (the environment and flags override it), as
    /// for `metfs mount`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Accepted and ignored, so that the flags of a `metfs mount` command line can be given
    /// unchanged.
    #[arg(long, hide = true)]
    reset: bool,
    #[command(flatten)]
    settings: MountSettings,
}

/// Writes (or keeps) the catalog file and prints one line saying what it holds.
pub(super) fn catalog_cmd(mut args: CatalogArgs, sub: &clap::ArgMatches) -> Result<()> {
    let positional = args.dataset.take();
    if let Some(s) = &positional {
        args.settings.source = Some(s.clone());
    }
    // A catalog needs neither a cache nor a budget: where no layer gives them, stand-ins let
    // the mount's own resolution check and resolve everything else.
    let given = |id: &str| {
        (id == "source" && positional.is_some())
            || sub.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
    let mut layers = build_layers(&args, &given)?;
    let stand_in = ["cache", "budget"].map(|k| !layers.given(k));
    if stand_in.contains(&true) {
        if stand_in[0] {
            args.settings.cache = Some(std::env::temp_dir());
        }
        if stand_in[1] {
            args.settings.budget = Some("1GiB".parse().map_err(|e: String| anyhow!(e))?);
        }
        let given = |id: &str| {
            given(id) || (id == "cache" && stand_in[0]) || (id == "budget" && stand_in[1])
        };
        layers = build_layers(&args, &given)?;
    }
    let cfg = MountConfig::resolve(&layers)?;
    let out = args.output.or_else(|| cfg.catalog.clone()).ok_or_else(|| {
        anyhow!("no catalog file to write: give -o FILE, set METFS_CATALOG or `catalog`")
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let made_by = format!("metfs {}", env!("CARGO_PKG_VERSION"));
    let made = rt
        .block_on(daemon::make_catalog_file(&cfg, &out, args.fresh, &made_by))
        .with_context(|| format!("catalog of {}", cfg.source))?;
    let h = &made.header;
    if let Some(why) = &made.replaced {
        eprintln!("metfs: {} replaced: {why}", out.display());
    }
    println!(
        "catalog {}: {} samples, {} of {} (version digest {:08x}); {}",
        out.display(),
        h.samples,
        metfs_plan::size::format_bytes(h.bytes),
        h.source,
        h.versions_digest,
        if made.kept {
            "kept: still current"
        } else {
            "written"
        }
    );
    Ok(())
}

fn build_layers(args: &CatalogArgs, given: &dyn Fn(&str) -> bool) -> Result<Layers> {
    let mut layers = Layers::new();
    if let Some(p) = &args.config {
        layers = layers.file(p)?;
    }
    Ok(layers.env(std::env::vars()).flags(&args.settings, given)?)
}
