//! `metfs-shuffle`: the exchange of aggregate-cache mode, one MPI rank per node, beside the
//! node's `metfs mount --aggregate` daemon (`srun --overlap`, or `mpirun -np N`); with
//! `--sender extra`, one rank more (`mpirun -np N+1`), the paper's extra rank.
//!
//! For each epoch after the first it waits until its daemon opens the epoch's inbox (the
//! daemon's staging of that epoch has started), then the ranks exchange, in bulk-synchronous
//! rounds of at most `--chunk-mib` per pair (`MPI_Alltoallv`), what the daemons'
//! `--shuffle-code` says: uncoded, each sample a node needs; coded (`uberShuffle`), the XOR
//! packets of the coded plan, then uncoded frames for what that plan does not cover.
//!
//! * `--sender peers` (the default): the nodes that hold the samples send them (or the
//!   packets of them), read from their previous slot.
//! * `--sender extra`: the last rank is no node; it has no daemon and no cache, receives rank
//!   0's spec and catalog over MPI, reads every sample (uncoded) or operand (coded) it sends
//!   from the tier (the daemons' POSIX source, or `--tier`), and the nodes only receive.
//!
//! Coded packets go `--broadcast ring` (the default: scatter-then-ring, Theorem 3: after each
//! round's scatter, ring stages, one `MPI_Alltoallv` each, until no rank has a part to
//! forward) or `direct` (whole, to each receiver). Each node keeps in its inbox
//! what it receives, decodes and checks. The logic is the `metfs_exchange` library; this file
//! is the transport: it counts the bytes and messages it puts on the wire. One JSON line per
//! epoch and rank on stdout ([`metfs_exchange::ExchangeReport`]).
//!
//! Before the first exchange the ranks compare their daemons' settings and catalogs, their
//! `--sender` and `--broadcast`, and their epochs, and all refuse to start (exit 2) if any
//! differs; before each coded exchange, the digests of their coded plans. A rank that dies
//! ends the MPI job; the daemons then stop waiting after `--shuffle-timeout-secs` and fetch
//! from the tier. When a node's daemon is gone, every rank stops at the next epoch.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

use metfs_exchange::coded::{CodedPlan, Decoder, Encoder};
use metfs_exchange::spec::inbox_of_epoch;
use metfs_exchange::uncoded::Outbox;
use metfs_exchange::{
    Accepted, Broadcast, ExchangeError, ExchangeReport, ExchangeSpec, Inbox, Node, SenderMode,
    ShuffleCode, AGREEMENT,
};

#[derive(Parser)]
#[command(
    name = "metfs-shuffle",
    version,
    about = "Aggregate-cache mode's exchange between nodes (one MPI rank per node, and one more with --sender extra)"
)]
struct Args {
    /// The node's cache directory (its daemon's `--cache`); `%r` is replaced by the MPI rank.
    /// The extra rank has none.
    #[arg(long)]
    cache: String,
    /// Who sends: `peers`, the nodes holding the samples; or `extra`, one more rank than
    /// nodes (the last), which reads what it sends from the tier (the paper's model).
    #[arg(long, value_enum, default_value_t = SenderMode::Peers)]
    sender: SenderMode,
    /// How coded packets reach their receivers: `ring` (scatter-then-ring, Theorem 3: the
    /// sender's port carries each packet once) or `direct` (whole, to each receiver). Ring by
    /// default: it put 11-15% fewer bytes through the busiest port with peers sending and
    /// 2.3-2.6x fewer with the extra rank, for the same payload (docs/BENCHMARKS.md).
    #[arg(long, value_enum, default_value_t = Broadcast::Ring)]
    broadcast: Broadcast,
    /// The extra rank's tier: the daemons' POSIX source as this rank sees it (default: the
    /// source in rank 0's spec).
    #[arg(long)]
    tier: Option<PathBuf>,
    /// Stop after this many exchanges (default: until a daemon is gone).
    #[arg(long)]
    epochs: Option<u64>,
    /// Most bytes one rank sends another in one round.
    #[arg(long, default_value_t = 64)]
    chunk_mib: usize,
    /// Fault injection for tests: flip a byte of the first sample (or coded packet, or part)
    /// each sending rank sends each peer in each epoch (the receiver's check must refuse it
    /// and the tier serve it).
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

/// Words each rank contributes to the agreement: opened (0: no, 1: a node, 2: the extra
/// rank), its node rank, [`Node::agreement`], and its `--sender` and `--broadcast`.
const WORDS: usize = 3 + AGREEMENT;

fn run(world: &SimpleCommunicator) -> Result<()> {
    let args = Args::parse();
    let rank = world.rank() as u32;
    let size = world.size() as u32;
    let extra_mode = args.sender == SenderMode::Extra;
    let nodes = size - u32::from(extra_mode);
    let is_extra = extra_mode && rank == nodes;
    let modes = args.sender as u64 | (args.broadcast as u64) << 8;
    let cache = PathBuf::from(args.cache.replace("%r", &rank.to_string()));
    // Every rank reaches the agreement below, even one that cannot open its node, so that no
    // rank waits forever for it.
    let opened = (!is_extra).then(|| Node::open(&cache));
    let all = agree(world, opened.as_ref(), modes)?;
    if size < 2 || (extra_mode && size < 3) {
        bail!("{size} ranks: aggregate mode needs at least two nodes, and --sender extra one rank more than nodes");
    }
    let node = match opened {
        Some(opened) => {
            let node = opened
                .with_context(|| format!("node {}", cache.display()))?
                .with_modes(args.sender, args.broadcast);
            if node.spec.rank != rank || node.spec.nodes != nodes {
                let extra = if extra_mode {
                    " and, with --sender extra, one rank more than nodes (the last)"
                } else {
                    ""
                };
                bail!(
                    "the daemon at {} is node {} of {}, but this is MPI rank {rank} of {size}: start one rank per node, rank r on node r{extra}",
                    cache.display(),
                    node.spec.rank,
                    node.spec.nodes
                );
            }
            for (r, rec) in all.chunks(WORDS).enumerate().take(nodes as usize) {
                if rec[0] != 1 {
                    bail!("rank {r} could not open its node (see its message); no exchange");
                }
                let other: [u64; AGREEMENT] = rec[2..2 + AGREEMENT]
                    .try_into()
                    .expect("the agreement's words");
                if let Some(why) = node.disagreement(r, &other) {
                    bail!("{why}");
                }
            }
            Some(node)
        }
        None => None,
    };
    // The extra rank learns the plan's inputs from rank 0: its spec, catalog and groups.
    let node = if extra_mode {
        extra_mode_node(world, &args, node, nodes)?
    } else {
        node.expect("every rank is a node in peers mode")
    };
    tracing::info!(rank, nodes, sender = ?args.sender, broadcast = ?args.broadcast, code = %node.spec.code, "ranks agree; waiting for the daemons' first inbox");
    // The epoch to fill first: every daemon must be at the same one.
    let Some(mut epoch) = first_epoch(world, &node, nodes)? else {
        return Ok(());
    };
    let chunk = args.chunk_mib.max(1) << 20;
    let mut done = 0u64;
    loop {
        // Wait for this node's inbox (the daemon's staging of `epoch` started); every rank
        // goes on only if every node's daemon is there.
        let mut go = 1u8;
        if !node.is_extra() {
            while !node.inbox_open(epoch) {
                if !alive(node.spec.pid) {
                    go = 0;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let mut all_go = 0u8;
        world.all_reduce_into(&go, &mut all_go, SystemOperation::min());
        if all_go == 0 {
            tracing::info!(rank, "a daemon is gone; stopping");
            return Ok(());
        }
        let report = exchange(world, &node, epoch, chunk, args.inject_corruption)?;
        println!("{}", serde_json::to_string(&report)?);
        done += 1;
        epoch += 1;
        if args.epochs.is_some_and(|n| done >= n) {
            return Ok(());
        }
    }
}

/// Gathers every rank's words for the agreement (see [`WORDS`]) and checks that all were
/// started with this rank's `--sender` and `--broadcast` (`modes`).
fn agree(
    world: &SimpleCommunicator,
    opened: Option<&Result<Node, ExchangeError>>,
    modes: u64,
) -> Result<Vec<u64>> {
    let mut mine = [0u64; WORDS];
    mine[WORDS - 1] = modes;
    match opened {
        Some(Ok(n)) => {
            mine[0] = 1;
            mine[1] = u64::from(n.spec.rank);
            mine[2..2 + AGREEMENT].copy_from_slice(&n.agreement());
        }
        Some(Err(_)) => {}
        None => mine[0] = 2,
    }
    let mut all = vec![0u64; WORDS * world.size() as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    if let Some((r, _)) = all
        .chunks(WORDS)
        .enumerate()
        .find(|(_, rec)| rec[WORDS - 1] != modes)
    {
        bail!("rank {r} was started with another --sender or --broadcast than this rank: start every rank with the same flags");
    }
    Ok(all)
}

/// With `--sender extra`, every rank's node: rank 0's spec, catalog and groups go to every rank, the
/// extra rank (which has no `node`) makes its node from them, and every rank learns whether
/// it could before anyone waits for it.
fn extra_mode_node(
    world: &SimpleCommunicator,
    args: &Args,
    node: Option<Node>,
    nodes: u32,
) -> Result<Node> {
    let (spec, catalog, groups) = match &node {
        Some(n) if world.rank() == 0 => (
            serde_json::to_vec(&n.spec)?,
            std::fs::read(&n.spec.catalog)
                .with_context(|| format!("reading {}", n.spec.catalog.display()))?,
            n.groups_bytes(),
        ),
        _ => (Vec::new(), Vec::new(), Vec::new()),
    };
    let spec = broadcast_bytes(world, spec);
    let catalog = broadcast_bytes(world, catalog);
    let groups = broadcast_bytes(world, groups);
    let made = match node {
        Some(n) => Ok(n),
        None => (|| {
            let tier = match &args.tier {
                Some(t) => t.clone(),
                None => {
                    let spec: ExchangeSpec = serde_json::from_slice(&spec)?;
                    if spec.source.contains("://") {
                        bail!("the daemons' source is {}: the extra rank reads a POSIX tier only; use --sender peers", spec.source);
                    }
                    PathBuf::from(spec.source)
                }
            };
            Ok(Node::extra(&spec, &catalog, &groups, &tier)?
                .with_modes(args.sender, args.broadcast))
        })(),
    };
    // Every rank learns whether the extra rank is ready before anyone waits for it.
    let ready = u8::from(made.is_ok());
    let mut all_ready = 0u8;
    world.all_reduce_into(&ready, &mut all_ready, SystemOperation::min());
    let node = made.context("the extra rank")?;
    if all_ready == 0 {
        bail!("rank {nodes}, the extra rank, could not start (see its message); no exchange");
    }
    Ok(node)
}

/// The epoch every daemon stages first (the extra rank takes rank 0's), once each has opened
/// an inbox; `None` when this node's daemon is gone.
fn first_epoch(world: &SimpleCommunicator, node: &Node, nodes: u32) -> Result<Option<u64>> {
    let mut epoch = if node.is_extra() {
        u64::MAX
    } else {
        loop {
            if let Some(e) = first_open_inbox(node)? {
                break e;
            }
            if !alive(node.spec.pid) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut epochs = vec![0u64; world.size() as usize];
    world.all_gather_into(&epoch, &mut epochs[..]);
    if node.is_extra() {
        epoch = epochs[0];
    }
    if let Some((r, e)) = epochs[..nodes as usize]
        .iter()
        .enumerate()
        .find(|(_, &e)| e != epoch)
    {
        bail!("rank {r}'s daemon is staging epoch {e}, this one epoch {epoch}: mount every node afresh (or with the same saved position)");
    }
    Ok(Some(epoch))
}

/// Rank 0's `bytes`, on every rank.
fn broadcast_bytes(world: &SimpleCommunicator, mut bytes: Vec<u8>) -> Vec<u8> {
    let root = world.process_at_rank(0);
    let mut len = bytes.len() as u64;
    root.broadcast_into(&mut len);
    bytes.resize(len as usize, 0);
    // Open MPI refuses a broadcast of no bytes (an empty slice's pointer): nothing to send.
    if len > 0 {
        root.broadcast_into(&mut bytes[..]);
    }
    bytes
}

/// One epoch's exchange (module docs).
fn exchange(
    world: &SimpleCommunicator,
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
        sender: node.sender,
        broadcast: node.broadcast,
        ..Default::default()
    };
    let coded = match node.spec.code {
        ShuffleCode::Uncoded => None,
        ShuffleCode::UberShuffle => coded_plan(world, node, epoch, &plan)?,
    };
    // The extra rank only sends: it has no inbox.
    let expected = match &coded {
        None => node.expected(&plan),
        Some(cp) => cp.uncoded_expected(rank),
    };
    let mut inbox = if node.is_extra() {
        None
    } else {
        Some(node.inbox(epoch, expected)?)
    };
    let mut got = Accepted::default();
    match &coded {
        None => {
            let mut out = Outbox::new(node, epoch, node.outgoing(&plan));
            if corrupt {
                out = out.corrupt_first();
            }
            send_uncoded(
                world,
                node,
                &mut report,
                chunk,
                out,
                inbox.as_mut(),
                &mut got,
            )?;
        }
        Some(cp) => send_coded(
            world,
            node,
            cp,
            (&mut report, chunk, corrupt),
            inbox.as_mut(),
            &mut got,
        )?,
    }
    report.received_samples = got.samples;
    report.received_bytes = got.bytes;
    report.rejected = got.rejected;
    if let Some(inbox) = inbox {
        report.missing = inbox.missing() as u64;
        inbox.complete()?;
    }
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
        "{}",
        if node.is_extra() { "sent" } else { "inbox complete" }
    );
    Ok(report)
}

/// One epoch's coded exchange of `cp`: rounds of packets (and ring parts), then what the plan
/// leaves uncoded; `report` counts it, `got` what `inbox` accepted.
fn send_coded(
    world: &SimpleCommunicator,
    node: &Node,
    cp: &CodedPlan,
    (report, chunk, corrupt): (&mut ExchangeReport, usize, bool),
    mut inbox: Option<&mut Inbox>,
    got: &mut Accepted,
) -> Result<()> {
    let epoch = cp.epoch;
    let rank = node.spec.rank;
    report.code = ShuffleCode::UberShuffle;
    report.plan_secs = cp.secs;
    if let Some(inbox) = inbox.as_deref_mut() {
        inbox.expect_decoded(cp.decoded_for(rank));
    }
    let mut enc = Encoder::new(node, cp);
    if corrupt {
        enc = enc.corrupt_first();
    }
    let mut side = Coded {
        enc: &mut enc,
        dec: Decoder::new(node, cp),
        inbox: inbox.as_deref_mut(),
        got: &mut *got,
    };
    rounds(
        world,
        report,
        chunk,
        node.broadcast == Broadcast::Ring,
        &mut side,
    )?;
    let dec = side.dec;
    report.packets = enc.packets;
    report.packet_bytes = enc.packet_bytes;
    report.frames += enc.frames + dec.forwarded;
    report.payload_bytes += enc.frame_bytes + dec.forwarded_bytes;
    report.forwarded = dec.forwarded;
    report.forwarded_bytes = dec.forwarded_bytes;
    report.tier_bytes += enc.tier_bytes();
    report.decoded_blocks = dec.blocks;
    let incomplete = if node.is_extra() { 0 } else { dec.incomplete() };
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
        send_uncoded(world, node, report, chunk, out, inbox, got)?;
    }
    Ok(())
}

/// The coded plan of `epoch`, the same on every rank (they compare digests), or `None` when
/// it cannot be made (then on every rank alike: the plan is pure) and the epoch goes uncoded.
fn coded_plan(
    world: &SimpleCommunicator,
    node: &Node,
    epoch: u64,
    plan: &metfs_shuffle::Transition,
) -> Result<Option<CodedPlan>> {
    let coded = node.coded_plan(epoch, plan);
    let digest = coded.as_ref().map_or(0, CodedPlan::digest);
    let mut all = vec![0u64; world.size() as usize];
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

/// One rank's side of a bulk-synchronous exchange, for [`rounds`].
trait Side {
    /// This round's parts, one per rank (at most `max` bytes each but one frame), and whether
    /// this rank has sent everything.
    fn next(&mut self, max: usize) -> (Vec<Vec<u8>>, bool);
    /// Takes a part received from rank `from`.
    fn accept(&mut self, from: u32, part: &[u8]) -> Result<(), ExchangeError>;
    /// The parts to forward in the next ring stage, by rank.
    fn forwards(&mut self) -> Vec<Vec<u8>> {
        Vec::new()
    }
}

/// The uncoded exchange of an outbox's samples, and of every peer's to this node's inbox.
struct Uncoded<'a, 'b> {
    node: &'a Node,
    out: Outbox<'a>,
    inbox: Option<&'b mut Inbox>,
    got: &'b mut Accepted,
}

impl Side for Uncoded<'_, '_> {
    fn next(&mut self, max: usize) -> (Vec<Vec<u8>>, bool) {
        (self.out.round(max), self.out.done())
    }

    fn accept(&mut self, from: u32, part: &[u8]) -> Result<(), ExchangeError> {
        let inbox = self
            .inbox
            .as_deref_mut()
            .ok_or(ExchangeError::ToExtra { from })?;
        *self.got += inbox.accept(self.node, from, part)?;
        Ok(())
    }
}

/// The coded exchange: this rank's packets out, others' packets (and ring parts) in.
struct Coded<'a, 'b> {
    enc: &'b mut Encoder<'a>,
    dec: Decoder<'a>,
    inbox: Option<&'b mut Inbox>,
    got: &'b mut Accepted,
}

impl Side for Coded<'_, '_> {
    fn next(&mut self, max: usize) -> (Vec<Vec<u8>>, bool) {
        (self.enc.round(max), self.enc.done())
    }

    fn accept(&mut self, from: u32, part: &[u8]) -> Result<(), ExchangeError> {
        let inbox = self
            .inbox
            .as_deref_mut()
            .ok_or(ExchangeError::ToExtra { from })?;
        *self.got += self.dec.accept(inbox, from, part)?;
        Ok(())
    }

    fn forwards(&mut self) -> Vec<Vec<u8>> {
        self.dec.forwards()
    }
}

fn send_uncoded(
    world: &SimpleCommunicator,
    node: &Node,
    report: &mut ExchangeReport,
    chunk: usize,
    out: Outbox<'_>,
    inbox: Option<&mut Inbox>,
    got: &mut Accepted,
) -> Result<()> {
    let mut side = Uncoded {
        node,
        out,
        inbox,
        got,
    };
    rounds(world, report, chunk, false, &mut side)?;
    let out = side.out;
    report.sent_samples += out.samples;
    report.frames += out.samples;
    report.payload_bytes += out.bytes;
    report.tier_bytes += out.tier_bytes();
    Ok(())
}

/// Bulk-synchronous rounds until no rank has anything left: each round one stage of the
/// parts `side.next` gives, then, for a ring, stages of the parts `side.forwards` gives until
/// no rank has any. Counts the messages and bytes this rank puts on and takes off the wire,
/// the rounds and the ring stages.
fn rounds(
    world: &SimpleCommunicator,
    report: &mut ExchangeReport,
    chunk: usize,
    ring: bool,
    side: &mut dyn Side,
) -> Result<()> {
    loop {
        let (parts, done) = side.next(chunk);
        stage(world, report, parts, side)?;
        report.rounds += 1;
        // Ring stages until no rank has a part to forward (at most the largest group − 1).
        let mut forwarding = ring;
        while forwarding {
            let parts = side.forwards();
            let some = u8::from(parts.iter().any(|p| !p.is_empty()));
            let mut any = 0u8;
            world.all_reduce_into(&some, &mut any, SystemOperation::max());
            forwarding = any > 0;
            if forwarding {
                stage(world, report, parts, side)?;
                report.stages += 1;
            }
        }
        // Done when every rank has sent everything.
        let left = u8::from(!done);
        let mut any_left = 0u8;
        world.all_reduce_into(&left, &mut any_left, SystemOperation::max());
        if any_left == 0 {
            return Ok(());
        }
    }
}

/// One `MPI_Alltoallv`: `parts[j]` to rank `j` (missing ones empty), and each part received
/// to `side.accept`.
fn stage(
    world: &SimpleCommunicator,
    report: &mut ExchangeReport,
    mut parts: Vec<Vec<u8>>,
    side: &mut dyn Side,
) -> Result<()> {
    let n = world.size() as usize;
    parts.resize(n, Vec::new());
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
    // Never an empty buffer: an empty Vec's pointer is 1, which Open MPI reads as
    // MPI_IN_PLACE (a rank that sends or receives nothing this stage).
    let mut recv = vec![0u8; total.max(1)];
    if send.is_empty() {
        send.push(0);
    }
    {
        let sp = Partition::new(&send[..], &counts[..], &sd[..]);
        let mut rp = PartitionMut::new(&mut recv[..], &recv_counts[..], &rd[..]);
        world.all_to_all_varcount_into(&sp, &mut rp);
    }
    report.recv_bytes += total as u64;
    for j in 0..n {
        let part = &recv[rd[j] as usize..(rd[j] + recv_counts[j]) as usize];
        if !part.is_empty() {
            side.accept(j as u32, part)?;
        }
    }
    Ok(())
}
