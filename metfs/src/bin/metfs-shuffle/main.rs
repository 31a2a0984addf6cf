//! `metfs-shuffle`: the exchange of aggregate-cache mode, one MPI rank per node, beside the
//! node's `metfs mount --aggregate` daemon (`srun --overlap`, or `mpirun -np N`).
//!
//! For each epoch after the first it waits until its daemon opens the epoch's inbox (the
//! daemon's staging of that epoch has started), then every rank sends every other rank, in
//! bulk-synchronous rounds of at most `--chunk-mib` per pair (`MPI_Alltoallv`), what the
//! daemons' `--shuffle-code` says: uncoded, the samples the planner names it for; coded
//! (`uberShuffle`), the XOR packets the coded plan names it the sender of, each sent directly
//! to each of its receivers (no scatter-then-ring: `metfs::exchange::coded`), then uncoded
//! frames for what that plan does not cover. Each rank keeps in its inbox what it receives,
//! decodes and checks. The logic is `metfs::exchange`; this file is the transport: it counts
//! the bytes and messages it puts on the wire. One JSON line per epoch on stdout
//! ([`metfs::exchange::ExchangeReport`]).
//!
//! Before the first exchange the ranks compare their daemons' settings and catalogs and their
//! epochs, and all refuse to start (exit 2) if any differs; before each coded exchange, the
//! digests of their coded plans. A rank that dies ends the MPI job;
//! the daemons then stop waiting after `--shuffle-timeout-secs` and fetch from the tier.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::traits::*;
use mpi::Count;

use metfs::config::aggregate::ShuffleCode;
use metfs::daemon::aggregate::inbox_of_epoch;
use metfs::exchange::coded::{CodedPlan, Decoder, Encoder};
use metfs::exchange::uncoded::Outbox;
use metfs::exchange::{Accepted, ExchangeReport, Inbox, Node};

#[derive(Parser)]
#[command(
    name = "metfs-shuffle",
    version,
    about = "Aggregate-cache mode's exchange between nodes (one MPI rank per node)"
)]
struct Args {
    /// The node's cache directory (its daemon's `--cache`); `%r` is replaced by the MPI rank.
    #[arg(long)]
    cache: String,
    /// Stop after this many exchanges (default: until the daemon is gone).
    #[arg(long)]
    epochs: Option<u64>,
    /// Most bytes one rank sends another in one round.
    #[arg(long, default_value_t = 64)]
    chunk_mib: usize,
    /// Fault injection for tests: flip a byte of the first sample (or coded packet) each rank
    /// sends each peer in each epoch (the receiver's check must refuse it and the tier serve
    /// it).
    #[arg(long, hide = true)]
    inject_corruption: bool,
}

fn main() {
    let universe = match mpi::initialize() {
        Some(u) => u,
        None => {
            eprintln!("metfs-shuffle: MPI was already initialised");
            std::process::exit(1);
        }
    };
    let world = universe.world();
    let rank = world.rank();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("METFS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let code = match run(&world) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("metfs-shuffle: rank {rank}: {e:#}");
            2
        }
    };
    drop(universe);
    std::process::exit(code);
}

/// Whether the daemon `pid` still runs.
fn alive(pid: u32) -> bool {
    // Signal 0 checks existence and permission only.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// The lowest epoch whose inbox the daemon has opened, once it has opened one.
fn first_open_inbox(node: &Node) -> Result<Option<u64>> {
    let mut lowest = None;
    for e in std::fs::read_dir(&node.spec.slots)
        .with_context(|| format!("listing {}", node.spec.slots.display()))?
        .flatten()
    {
        let name = e.file_name();
        let Some(epoch) = name
            .to_str()
            .and_then(|n| n.strip_prefix("inbox-e"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if e.path().is_dir() && inbox_of_epoch(epoch) == name.to_string_lossy() {
            lowest = Some(lowest.map_or(epoch, |l: u64| l.min(epoch)));
        }
    }
    Ok(lowest)
}

fn run(world: &mpi::topology::SimpleCommunicator) -> Result<()> {
    let args = Args::parse();
    let rank = world.rank() as u32;
    let size = world.size() as u32;
    let cache = PathBuf::from(args.cache.replace("%r", &rank.to_string()));
    // Every rank reaches the agreement below, even one that cannot open its node, so that no
    // rank waits forever for it.
    let opened = Node::open(&cache);
    let mine: [u64; 8] = match &opened {
        Ok(n) => {
            let a = n.agreement();
            [
                1,
                u64::from(n.spec.rank),
                a[0],
                a[1],
                a[2],
                a[3],
                a[4],
                a[5],
            ]
        }
        Err(_) => [0; 8],
    };
    let mut all = vec![0u64; 8 * size as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    let node = opened.with_context(|| format!("node {}", cache.display()))?;
    if node.spec.rank != rank || node.spec.nodes != size {
        bail!(
            "the daemon at {} is node {} of {}, but this is MPI rank {rank} of {size}: start one rank per node, rank r on node r",
            cache.display(),
            node.spec.rank,
            node.spec.nodes
        );
    }
    for (r, rec) in all.chunks(8).enumerate() {
        if rec[0] == 0 {
            bail!("rank {r} could not open its node (see its message); no exchange");
        }
        let other: [u64; 6] = rec[2..8].try_into().expect("6 words");
        if let Some(why) = node.disagreement(r, &other) {
            bail!("{why}");
        }
    }
    tracing::info!(rank, nodes = size, cache = %cache.display(), code = %node.spec.code, "ranks agree; waiting for the daemon's first inbox");
    // The epoch to fill first: every daemon must be at the same one.
    let mut epoch = loop {
        if let Some(e) = first_open_inbox(&node)? {
            break e;
        }
        if !alive(node.spec.pid) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut epochs = vec![0u64; size as usize];
    world.all_gather_into(&epoch, &mut epochs[..]);
    if let Some((r, e)) = epochs.iter().enumerate().find(|(_, &e)| e != epoch) {
        bail!("rank {r}'s daemon is staging epoch {e}, this one epoch {epoch}: mount every node afresh (or with the same saved position)");
    }
    let chunk = args.chunk_mib.max(1) << 20;
    let mut done = 0u64;
    loop {
        // Wait for this node's inbox (the daemon's staging of `epoch` started).
        while !node.inbox_open(epoch) {
            if !alive(node.spec.pid) {
                tracing::info!(rank, "the daemon is gone; stopping");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        world.barrier();
        let report = exchange(world, &node, epoch, chunk, args.inject_corruption)?;
        println!("{}", serde_json::to_string(&report)?);
        done += 1;
        epoch += 1;
        if args.epochs.is_some_and(|n| done >= n) {
            return Ok(());
        }
    }
}

/// One epoch's exchange (module docs).
fn exchange(
    world: &mpi::topology::SimpleCommunicator,
    node: &Node,
    epoch: u64,
    chunk: usize,
    corrupt: bool,
) -> Result<ExchangeReport> {
    let t0 = Instant::now();
    let rank = node.spec.rank;
    let plan = node.transition(epoch, &[])?;
    let mut report = ExchangeReport {
        rank,
        epoch,
        ..Default::default()
    };
    let mut got = Accepted::default();
    let coded = match node.spec.code {
        ShuffleCode::Uncoded => None,
        ShuffleCode::UberShuffle => coded_plan(world, node, epoch, &plan)?,
    };
    let inbox = match &coded {
        None => {
            let mut inbox = node.inbox(epoch, node.expected(&plan))?;
            let mut out = Outbox::new(node, epoch, node.outgoing(&plan));
            if corrupt {
                out = out.corrupt_first();
            }
            send_uncoded(world, node, &mut report, chunk, out, &mut inbox, &mut got)?;
            inbox
        }
        Some(cp) => {
            report.code = ShuffleCode::UberShuffle;
            report.plan_secs = cp.secs;
            let mut inbox = node.inbox(epoch, cp.uncoded_expected(rank))?;
            inbox.expect_decoded(cp.decoded_for(rank));
            let mut enc = Encoder::new(node, cp);
            if corrupt {
                enc = enc.corrupt_first();
            }
            let mut dec = Decoder::new(node, cp);
            rounds(
                world,
                &mut report,
                chunk,
                |max| (enc.round(max), enc.done()),
                |from, part| {
                    got += dec.accept(&mut inbox, from, part)?;
                    Ok(())
                },
            )?;
            (report.packets, report.packet_bytes) = (enc.packets, enc.packet_bytes);
            report.decoded_blocks = dec.blocks;
            let incomplete = dec.incomplete();
            if incomplete > 0 {
                tracing::warn!(
                    epoch,
                    incomplete,
                    "samples whose blocks did not all arrive; the tier serves them"
                );
            }
            // What the coded plan does not cover goes uncoded; every rank knows whether
            // anything does.
            if cp.has_uncoded() {
                let out = Outbox::new(node, epoch, cp.uncoded_outgoing(rank));
                send_uncoded(world, node, &mut report, chunk, out, &mut inbox, &mut got)?;
            }
            inbox
        }
    };
    report.received_samples = got.samples;
    report.received_bytes = got.bytes;
    report.rejected = got.rejected;
    report.missing = inbox.missing() as u64;
    inbox.complete()?;
    report.secs = t0.elapsed().as_secs_f64();
    tracing::info!(
        epoch,
        code = %report.code,
        sent_bytes = report.sent_bytes,
        packets = report.packets,
        received = report.received_samples,
        rejected = report.rejected,
        missing = report.missing,
        secs = report.secs,
        "inbox complete"
    );
    Ok(report)
}

/// The coded plan of `epoch`, the same on every rank (they compare digests), or `None` when
/// it cannot be made (then on every rank alike: the plan is pure) and the epoch goes uncoded.
fn coded_plan(
    world: &mpi::topology::SimpleCommunicator,
    node: &Node,
    epoch: u64,
    plan: &shuffle::Transition,
) -> Result<Option<CodedPlan>> {
    let coded = node.coded_plan(epoch, plan);
    let digest = coded.as_ref().map_or(0, CodedPlan::digest);
    let mut all = vec![0u64; node.spec.nodes as usize];
    world.all_gather_into(&digest, &mut all[..]);
    if let Some((r, d)) = all.iter().enumerate().find(|(_, &d)| d != digest) {
        bail!("rank {r}'s coded plan of epoch {epoch} differs from this rank's (digest {d:016x} against {digest:016x}): run the same metfs-shuffle on every node");
    }
    match coded {
        Ok(c) => Ok(Some(c)),
        Err(e) => {
            tracing::warn!(epoch, error = %e, "no coded plan; this epoch goes uncoded");
            Ok(None)
        }
    }
}

/// Bulk-synchronous rounds (`MPI_Alltoallv`) until no rank has anything left: each round
/// `next(max)` gives one part per rank (at most `max` bytes each but one frame) and whether
/// this rank is done, and `accept(from, part)` takes each part received. Counts the messages
/// and bytes this rank puts on the wire, and the rounds.
/// The uncoded exchange of `out`'s samples, and of every peer's to this node's `inbox`.
fn send_uncoded(
    world: &mpi::topology::SimpleCommunicator,
    node: &Node,
    report: &mut ExchangeReport,
    chunk: usize,
    mut out: Outbox<'_>,
    inbox: &mut Inbox,
    got: &mut Accepted,
) -> Result<()> {
    rounds(
        world,
        report,
        chunk,
        |max| (out.round(max), out.done()),
        |from, part| {
            *got += inbox.accept(node, from, part)?;
            Ok(())
        },
    )?;
    report.sent_samples = out.samples;
    Ok(())
}

fn rounds(
    world: &mpi::topology::SimpleCommunicator,
    report: &mut ExchangeReport,
    chunk: usize,
    mut next: impl FnMut(usize) -> (Vec<Vec<u8>>, bool),
    mut accept: impl FnMut(u32, &[u8]) -> Result<(), metfs::exchange::ExchangeError>,
) -> Result<()> {
    let n = world.size() as usize;
    loop {
        let (parts, done) = next(chunk);
        let mut counts: Vec<Count> = vec![0; n];
        let mut send = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for (j, part) in parts.iter().enumerate() {
            counts[j] = Count::try_from(part.len())
                .map_err(|_| anyhow!("a round's frames to rank {j} exceed 2 GiB"))?;
            report.sent_bytes += part.len() as u64;
            report.messages += u64::from(!part.is_empty());
            send.extend_from_slice(part);
        }
        let mut recv_counts: Vec<Count> = vec![0; n];
        world.all_to_all_into(&counts[..], &mut recv_counts[..]);
        let displs = |c: &[Count]| -> Vec<Count> {
            c.iter()
                .scan(0, |acc, &x| {
                    let d = *acc;
                    *acc += x;
                    Some(d)
                })
                .collect()
        };
        let (sd, rd) = (displs(&counts), displs(&recv_counts));
        let total: usize = recv_counts.iter().map(|&c| c as usize).sum();
        let mut recv = vec![0u8; total];
        {
            let sp = Partition::new(&send[..], &counts[..], &sd[..]);
            let mut rp = PartitionMut::new(&mut recv[..], &recv_counts[..], &rd[..]);
            world.all_to_all_varcount_into(&sp, &mut rp);
        }
        for j in 0..n {
            let part = &recv[rd[j] as usize..(rd[j] + recv_counts[j]) as usize];
            if !part.is_empty() {
                accept(j as u32, part)?;
            }
        }
        report.rounds += 1;
        // Done when every rank has sent everything.
        let left = u8::from(!done);
        let mut any_left = 0u8;
        world.all_reduce_into(&left, &mut any_left, SystemOperation::max());
        if any_left == 0 {
            return Ok(());
        }
    }
}
