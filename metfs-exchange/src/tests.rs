use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use metfs_prefetcher::stager::{create_private_dir, SlotJournal};
use metfs_shuffle::coded::Samples;
use metfs_tier::catalog::{Catalog, CatalogEntry};

use super::coded::{CodedPlan, Decoder, Encoder, BLOCK, CODED_HEADER, RING_HEADER};
use super::uncoded::{Outbox, HEADER};
use super::*;
use crate::spec::{inbox_of_epoch, slot_of_epoch};

/// `n` nodes' caches side by side: each has its spec, the catalog of `sizes`, and its slot of
/// epoch 0 (its whole cache, share and extras) staged, files and journal, as the daemon would.
fn nodes(dir: &Path, n: u32, extra: f64, sizes: &[u64]) -> Vec<Node> {
    let cat = Catalog::from_entries(
        "test",
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| CatalogEntry::new(format!("c{}/s{i:03}.bin", i % 3), s)),
    )
    .unwrap();
    let nodes: Vec<Node> = (0..n)
        .map(|rank| {
            let cache = dir.join(format!("n{rank}"));
            let slots = cache.join("slots");
            std::fs::create_dir_all(&slots).unwrap();
            let catalog = cache.join("catalog.bin");
            cat.save(&catalog).unwrap();
            let spec = ExchangeSpec {
                v: SPEC_VERSION,
                rank,
                nodes: n,
                seed: 3,
                budget: 1 << 20,
                extra,
                code: ShuffleCode::Uncoded,
                catalog_digest: format!("{:016x}", catalog_digest(&cat)),
                source: "test".into(),
                slots: slots.clone(),
                catalog,
                groups: None,
                socket: cache.join("metfs.sock"),
                pid: std::process::id(),
            };
            std::fs::write(cache.join(SPEC_FILE), serde_json::to_vec(&spec).unwrap()).unwrap();
            Node::open(&cache).unwrap()
        })
        .collect();
    for n in &nodes {
        let t0 = n.transition(0, &[]).unwrap();
        let slot = slot_of_epoch(0);
        let mut journal = String::new();
        for &id in &t0.nodes[n.spec.rank as usize].tier {
            let bytes = content(id, n.catalog.size(id));
            let p = n.spec.slots.join(&slot).join(n.catalog.path(id));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, &bytes).unwrap();
            journal += &format!("{id} {:08x}\n", crc32fast::hash(&bytes));
        }
        std::fs::write(n.spec.slots.join(format!("{slot}.journal")), journal).unwrap();
    }
    nodes
}

fn two_nodes(dir: &Path) -> (Node, Node) {
    let sizes: Vec<u64> = (0..40).map(|i| 1000 + 37 * i).collect();
    let mut it = nodes(dir, 2, 0.0, &sizes).into_iter();
    (it.next().unwrap(), it.next().unwrap())
}

/// Bytes of sample `id`: a different pseudo-random stream per sample (a XOR that picked the
/// wrong operand shows).
fn content(id: u32, len: u64) -> Vec<u8> {
    let mut x = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn open_inbox(n: &Node, epoch: u64) -> Inbox {
    create_private_dir(&n.spec.slots.join(inbox_of_epoch(epoch))).unwrap();
    let t = n.transition(epoch, &[]).unwrap();
    n.inbox(epoch, n.expected(&t)).unwrap()
}

/// The frames `a` sends rank `to` for `ids` in one round of at most `max` bytes.
fn frames(a: &Node, epoch: u64, to: u32, ids: &[u32], max: usize) -> Vec<u8> {
    let mut lists = vec![Vec::new(); a.spec.nodes as usize];
    lists[to as usize] = ids.to_vec();
    Outbox::new(a, epoch, lists)
        .round(max)
        .swap_remove(to as usize)
}

fn inbox_file(n: &Node, epoch: u64, id: u32) -> PathBuf {
    n.spec
        .slots
        .join(inbox_of_epoch(epoch))
        .join(n.catalog.path(id))
}

#[test]
fn what_one_node_sends_the_other_arrives_whole_and_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_nodes(dir.path());
    let t = a.transition(1, &[]).unwrap();
    let to_b = a.outgoing(&t)[1].clone();
    assert_eq!(
        b.expected(&t).values().filter(|&&f| f == 0).count(),
        to_b.len()
    );
    assert!(!to_b.is_empty());
    // Small rounds: several frames per round, every sample once.
    let mut inbox = open_inbox(&b, 1);
    let mut out = Outbox::new(&a, 1, a.outgoing(&t));
    let (mut rounds, mut got) = (0, Accepted::default());
    while !out.done() {
        let parts = out.round(4096);
        assert!(parts[0].is_empty() && parts[1].len() <= 4096 + HEADER + 3000);
        got += inbox.accept(&b, 0, &parts[1]).unwrap();
        rounds += 1;
    }
    assert!(rounds > 1);
    assert_eq!(
        (got.samples as usize, out.samples as usize),
        (to_b.len(), to_b.len())
    );
    assert_eq!(got.rejected, 0);
    assert_eq!(inbox.missing(), b.expected(&t).len() - to_b.len());
    inbox.complete().unwrap();
    let j = SlotJournal::of(&b.spec.slots, &inbox_of_epoch(1)).read();
    assert!(j.complete);
    for &id in &to_b {
        let p = inbox_file(&b, 1, id);
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes, content(id, b.catalog.size(id)));
        assert_eq!(j.staged[&id], crc32fast::hash(&bytes));
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o400
        );
    }
}

#[test]
fn a_corrupted_or_unexpected_sample_is_refused_and_left_to_the_tier() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_nodes(dir.path());
    let t = a.transition(1, &[]).unwrap();
    let to_b = a.outgoing(&t)[1].clone();
    let mut inbox = open_inbox(&b, 1);
    // A flipped payload byte: the CRC no longer matches (also the test transport's fault).
    let mut f = frames(&a, 1, 1, &to_b[..1], usize::MAX);
    f[HEADER] ^= 0xff;
    let got = inbox.accept(&b, 0, &f).unwrap();
    assert_eq!((got.samples, got.rejected), (0, 1));
    let lists = vec![Vec::new(), to_b[..1].to_vec()];
    let corrupt = Outbox::new(&a, 1, lists).corrupt_first().round(usize::MAX);
    assert_eq!(corrupt[1], f);
    // The right bytes from the wrong sender.
    let f = frames(&a, 1, 1, &to_b[..1], usize::MAX);
    let got = inbox.accept(&b, 1, &f).unwrap();
    assert_eq!((got.samples, got.rejected), (0, 1));
    // A sample the sender cannot read travels as missing.
    let slot = a.spec.slots.join(slot_of_epoch(0));
    std::fs::remove_file(slot.join(a.catalog.path(to_b[1]))).unwrap();
    let f = frames(&a, 1, 1, &to_b[1..2], usize::MAX);
    assert_eq!(f.len(), HEADER);
    assert_eq!(inbox.accept(&b, 0, &f).unwrap().rejected, 1);
    // Cut short: an error naming the sender, nothing kept.
    let f = frames(&a, 1, 1, &to_b[2..3], usize::MAX);
    let e = inbox.accept(&b, 0, &f[..f.len() - 1]).unwrap_err();
    assert!(e.to_string().contains("rank 0"), "{e}");
    assert_eq!(inbox.missing(), b.expected(&t).len());
    let inbox_dir = b.spec.slots.join(inbox_of_epoch(1));
    assert!(walk(&inbox_dir).is_empty(), "{:?}", walk(&inbox_dir));
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn ranks_that_differ_are_named_with_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_nodes(dir.path());
    assert_eq!(a.disagreement(1, &b.agreement()), None);
    let mut other = b.agreement();
    other[0] += 1;
    let why = a.disagreement(1, &other).unwrap();
    assert!(
        why.contains("rank 1's seed differs") && why.contains("--seed"),
        "{why}"
    );
    // A spec of another version, and a catalog that changed under the daemon.
    let cache = dir.path().join("n1");
    let text = std::fs::read_to_string(cache.join(SPEC_FILE)).unwrap();
    std::fs::write(
        cache.join(SPEC_FILE),
        text.replace(&format!("\"v\":{SPEC_VERSION}"), "\"v\":9"),
    )
    .unwrap();
    assert!(Node::open(&cache)
        .err()
        .unwrap()
        .to_string()
        .contains("version 9"));
    std::fs::write(cache.join(SPEC_FILE), &text).unwrap();
    let cat = Catalog::from_entries("test", [CatalogEntry::new("x.bin", 5)]).unwrap();
    cat.save(&cache.join("catalog.bin")).unwrap();
    let e = Node::open(&cache).err().unwrap().to_string();
    assert!(e.contains("the source changed"), "{e}");
}

/// Sizes of one to four blocks with short last blocks, and two empty samples.
fn mixed_sizes() -> Vec<u64> {
    (0..60u64)
        .map(|i| {
            if i == 5 || i == 17 {
                0
            } else {
                300 + (i * 2903) % 15000
            }
        })
        .collect()
}

/// What one rank's coded exchange did.
#[derive(Debug, Default)]
struct Outcome {
    got: Accepted,
    missing: usize,
    /// Bytes put on the wire, headers included.
    wire: u64,
    packets: u64,
    packet_bytes: u64,
    blocks: u64,
    /// Frames sent (whole packets, parts, forwarded parts) and their payload bytes.
    frames: u64,
    payload: u64,
    /// Bytes read from the tier (the extra rank).
    tier: u64,
}

/// One epoch's coded exchange between `ranks` in process, as `metfs-shuffle` runs it: the
/// nodes, then the extra rank if it is the last (it only sends); rounds of at most `chunk`
/// bytes per part, each part passed through `tamper(from, to, part)` on its way, each round
/// followed by ring stages while any rank has a part to forward; then the uncoded rounds for
/// what the plan does not cover. Every inbox is completed.
fn run_coded(
    ranks: &[Node],
    epoch: u64,
    chunk: usize,
    corrupt: Option<u32>,
    mut tamper: impl FnMut(u32, u32, &mut Vec<u8>),
) -> (Vec<CodedPlan>, Vec<Outcome>) {
    let t = ranks[0].transition(epoch, &[]).unwrap();
    let plans: Vec<CodedPlan> = ranks
        .iter()
        .map(|n| n.coded_plan(epoch, &t).unwrap())
        .collect();
    assert!(plans.iter().all(|p| p.digest() == plans[0].digest()));
    let mut inboxes: Vec<Option<Inbox>> = ranks
        .iter()
        .zip(&plans)
        .map(|(n, p)| {
            (!n.is_extra()).then(|| {
                create_private_dir(&n.spec.slots.join(inbox_of_epoch(epoch))).unwrap();
                let mut inbox = n.inbox(epoch, p.uncoded_expected(n.spec.rank)).unwrap();
                inbox.expect_decoded(p.decoded_for(n.spec.rank));
                inbox
            })
        })
        .collect();
    let mut enc: Vec<Encoder> = ranks
        .iter()
        .zip(&plans)
        .map(|(n, p)| {
            let e = Encoder::new(n, p);
            if corrupt == Some(n.spec.rank) {
                e.corrupt_first()
            } else {
                e
            }
        })
        .collect();
    let mut dec: Vec<Decoder> = ranks
        .iter()
        .zip(&plans)
        .map(|(n, p)| Decoder::new(n, p))
        .collect();
    let mut out: Vec<Outcome> = ranks.iter().map(|_| Outcome::default()).collect();
    let mut deliver = |rounds: Vec<Vec<Vec<u8>>>,
                       dec: &mut Vec<Decoder>,
                       inboxes: &mut Vec<Option<Inbox>>,
                       out: &mut Vec<Outcome>| {
        for (from, parts) in rounds.into_iter().enumerate() {
            for (to, mut part) in parts.into_iter().enumerate() {
                assert!(part.is_empty() || to != from);
                out[from].wire += part.len() as u64;
                tamper(from as u32, to as u32, &mut part);
                if !part.is_empty() {
                    let inbox = inboxes[to].as_mut().expect("only nodes receive");
                    out[to].got += dec[to].accept(inbox, from as u32, &part).unwrap();
                }
            }
        }
    };
    while enc.iter().any(|e| !e.done()) {
        let rounds: Vec<Vec<Vec<u8>>> = enc.iter_mut().map(|e| e.round(chunk)).collect();
        deliver(rounds, &mut dec, &mut inboxes, &mut out);
        while dec.iter().any(|d| d.has_forwards()) {
            let rounds = dec.iter_mut().map(|d| d.forwards()).collect();
            deliver(rounds, &mut dec, &mut inboxes, &mut out);
        }
    }
    for (i, n) in ranks.iter().enumerate() {
        let mut ob = Outbox::new(n, epoch, plans[i].uncoded_outgoing(n.spec.rank));
        while !ob.done() {
            for (to, part) in ob.round(chunk).into_iter().enumerate() {
                out[i].wire += part.len() as u64;
                if !part.is_empty() {
                    let inbox = inboxes[to].as_mut().expect("only nodes receive");
                    out[to].got += inbox.accept(&ranks[to], i as u32, &part).unwrap();
                }
            }
        }
        out[i].tier += ob.tier_bytes();
    }
    for (i, inbox) in inboxes.into_iter().enumerate() {
        if let Some(inbox) = inbox {
            out[i].missing = inbox.missing();
            inbox.complete().unwrap();
        }
        out[i].packets = enc[i].packets;
        out[i].packet_bytes = enc[i].packet_bytes;
        out[i].blocks = dec[i].blocks;
        out[i].frames = enc[i].frames + dec[i].forwarded;
        out[i].payload = enc[i].frame_bytes + dec[i].forwarded_bytes;
        out[i].tier += enc[i].tier_bytes();
    }
    (plans, out)
}

/// The extra rank beside `nodes`, with the same modes, reading a tier made under `dir` of
/// every sample's bytes.
fn extra_rank(dir: &Path, nodes: &[Node]) -> Node {
    let n0 = &nodes[0];
    let tier = dir.join("tier");
    for id in 0..n0.catalog.len() as u32 {
        let p = tier.join(n0.catalog.path(id));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content(id, n0.catalog.size(id))).unwrap();
    }
    let spec = std::fs::read(n0.spec.slots.parent().unwrap().join(SPEC_FILE)).unwrap();
    let cat = std::fs::read(&n0.spec.catalog).unwrap();
    Node::extra(&spec, &cat, &[], &tier)
        .unwrap()
        .with_modes(SenderMode::Extra, n0.broadcast)
}

/// `n` nodes with these modes, and the extra rank last in extra mode: 160 samples of mixed
/// sizes, extras kept with probability 0.6, so that packets reach up to three receivers.
fn ranks(dir: &Path, n: u32, sender: SenderMode, broadcast: Broadcast) -> Vec<Node> {
    let sizes: Vec<u64> = (0..160u64)
        .map(|i| {
            if i % 29 == 5 {
                0
            } else {
                300 + (i * 2903) % 15000
            }
        })
        .collect();
    let mut ns: Vec<Node> = nodes(dir, n, 0.6, &sizes)
        .into_iter()
        .map(|n| n.with_modes(sender, broadcast))
        .collect();
    if sender == SenderMode::Extra {
        let x = extra_rank(dir, &ns);
        ns.push(x);
    }
    ns
}

/// Every node received every sample it needed byte-exact and journaled, nothing refused.
fn check_delivered(ns: &[Node], out: &[Outcome], epoch: u64) {
    let t = ns[0].transition(epoch, &[]).unwrap();
    for (i, n) in ns.iter().enumerate().filter(|(_, n)| !n.is_extra()) {
        let o = &out[i];
        assert_eq!((o.got.rejected, o.missing), (0, 0), "node {i}: {o:?}");
        let wanted = &t.nodes[i].peer;
        assert_eq!(o.got.samples as usize, wanted.len());
        let j = SlotJournal::of(&n.spec.slots, &inbox_of_epoch(epoch)).read();
        assert!(j.complete);
        for &(id, _) in wanted {
            let bytes = std::fs::read(inbox_file(n, epoch, id)).unwrap();
            assert_eq!(
                bytes,
                content(id, n.catalog.size(id)),
                "sample {id} at node {i}"
            );
            assert_eq!(j.staged[&id], crc32fast::hash(&bytes));
        }
    }
}

#[test]
fn coded_packets_between_three_nodes_decode_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = mixed_sizes();
    let ns = nodes(dir.path(), 3, 0.5, &sizes);
    let (plans, out) = run_coded(&ns, 1, 3 * 4096, None, |_, _, _| {});
    let plan = &plans[0];
    // Real coding: some packets carry points for two receivers at once.
    assert!(plan.coded.packets.iter().any(|p| p.entries.len() >= 2));
    assert!((plan.coded.packets.len() as u64) < plan.coded.points);
    // The empty samples that moved went uncoded.
    let t = ns[0].transition(1, &[]).unwrap();
    let empty_moved = t
        .nodes
        .iter()
        .flat_map(|p| &p.peer)
        .filter(|(s, _)| ns[0].catalog.size(*s) == 0)
        .count();
    assert!(empty_moved > 0);
    assert_eq!(
        (0..3)
            .map(|r| plan.uncoded_expected(r).len())
            .sum::<usize>(),
        empty_moved
    );
    for (i, n) in ns.iter().enumerate() {
        let o = &out[i];
        assert_eq!((o.got.rejected, o.missing), (0, 0), "node {i}: {o:?}");
        let wanted = &t.nodes[i].peer;
        assert_eq!(o.got.samples as usize, wanted.len());
        let j = SlotJournal::of(&n.spec.slots, &inbox_of_epoch(1)).read();
        assert!(j.complete);
        for &(id, _) in wanted {
            let bytes = std::fs::read(inbox_file(n, 1, id)).unwrap();
            assert_eq!(
                bytes,
                content(id, n.catalog.size(id)),
                "sample {id} at node {i}"
            );
            assert_eq!(j.staged[&id], crc32fast::hash(&bytes));
        }
    }
    // Every point decoded once; each packet sent once, to each of its receivers, its padding
    // cut off the wire.
    assert_eq!(out.iter().map(|o| o.blocks).sum::<u64>(), plan.coded.points);
    assert_eq!(
        out.iter().map(|o| o.packets).sum::<u64>(),
        plan.coded.packets.len() as u64
    );
    let framed: u64 = (0..plan.coded.packets.len())
        .map(|p| {
            plan.coded.packets[p].entries.len() as u64 * (CODED_HEADER + plan.payload_len(p)) as u64
        })
        .sum();
    let uncoded_frames = empty_moved as u64 * HEADER as u64;
    assert_eq!(
        out.iter().map(|o| o.wire).sum::<u64>(),
        framed + uncoded_frames
    );
    let payload: u64 = out.iter().map(|o| o.packet_bytes).sum();
    assert!(payload < plan.coded.packets.len() as u64 * u64::from(BLOCK));
}

#[test]
fn a_corrupted_packet_or_an_unreadable_operand_loses_one_sample_not_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = mixed_sizes();
    let ns = nodes(dir.path(), 3, 0.5, &sizes);
    let t = ns[0].transition(1, &[]).unwrap();
    let moved: usize = t.nodes.iter().map(|p| p.peer.len()).sum();
    // Node 2 flips a payload byte of its first frame to each peer: each of those samples
    // fails its CRC once reassembled, every other arrives.
    let (plans, out) = run_coded(&ns, 1, 3 * 4096, Some(2), |_, _, _| {});
    let hit: Vec<u32> = (0..2)
        .filter(|&r| {
            plans[0]
                .senders
                .iter()
                .zip(&plans[0].coded.packets)
                .any(|(&s, p)| {
                    s == 2
                        && p.entries
                            .iter()
                            .any(|e| plans[0].demands[e.demand as usize].receiver == r)
                })
        })
        .collect();
    assert!(!hit.is_empty());
    for (r, o) in out.iter().enumerate() {
        let bad = usize::from(hit.contains(&(r as u32)));
        assert_eq!((o.got.rejected as usize, o.missing), (bad, bad), "node {r}");
    }
    assert_eq!(
        out.iter().map(|o| o.got.samples as usize).sum::<usize>(),
        moved - hit.len()
    );

    // A frame delivered as if from another rank is refused; the real one still counts.
    let dir = tempfile::tempdir().unwrap();
    let ns = nodes(dir.path(), 3, 0.5, &sizes);
    let mut copied = None;
    let (_, out) = run_coded(&ns, 1, 3 * 4096, None, |from, to, part| {
        if copied.is_none() && !part.is_empty() {
            copied = Some((from, to, part.clone()));
        }
    });
    assert!(out.iter().all(|o| o.missing == 0));
    let (from, to, part) = copied.unwrap();
    let plan = ns[0].coded_plan(1, &t).unwrap();
    let mut d = Decoder::new(&ns[to as usize], &plan);
    let mut inbox = ns[to as usize].inbox(1, HashMap::new()).unwrap();
    let other = (0..3).find(|&r| r != from && r != to).unwrap();
    let got = d.accept(&mut inbox, other, &part).unwrap();
    assert!(got.rejected > 0 && got.samples == 0, "{got:?}");
    // Cut short: an error naming the sender.
    let e = d
        .accept(&mut inbox, from, &part[..part.len() - 1])
        .unwrap_err();
    assert!(e.to_string().contains(&format!("rank {from}")), "{e}");

    // An operand its sender cannot read: the packet goes out as lost, its receivers leave
    // their samples to the tier, the rest arrives.
    let dir = tempfile::tempdir().unwrap();
    let ns = nodes(dir.path(), 3, 0.5, &sizes);
    let plan = ns[0].coded_plan(1, &t).unwrap();
    let (k, p) = plan
        .coded
        .packets
        .iter()
        .enumerate()
        .find(|(_, p)| p.entries.len() >= 2)
        .unwrap();
    let sender = &ns[plan.senders[k] as usize];
    let gone = plan.demands[p.entries[0].demand as usize].sample;
    std::fs::remove_file(
        sender
            .spec
            .slots
            .join(slot_of_epoch(0))
            .join(sender.catalog.path(gone)),
    )
    .unwrap();
    let (_, out) = run_coded(&ns, 1, 3 * 4096, None, |_, _, _| {});
    let lost: usize = out.iter().map(|o| o.missing).sum();
    assert!(lost >= p.entries.len(), "{out:?}");
    assert_eq!(
        out.iter().map(|o| o.got.rejected as usize).sum::<usize>(),
        lost
    );
    assert_eq!(
        out.iter().map(|o| o.got.samples as usize).sum::<usize>(),
        moved - lost
    );
}

#[test]
fn held_samples_stay_within_their_cap_and_unreadable_ones_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = two_nodes(dir.path());
    let mine = a.transition(0, &[]).unwrap().nodes[0].tier.clone();
    let mut held = Held::open(&a, 0, 2500);
    assert!(held.load(&mine[..2]));
    assert!(held.sample(mine[0]).is_some() && held.sample(mine[1]).is_some());
    // Over the cap: the least recently used goes, never one just asked for.
    assert!(held.load(&mine[2..3]));
    assert!(held.sample(mine[0]).is_none() && held.sample(mine[2]).is_some());
    assert_eq!(
        held.sample(mine[2]).unwrap(),
        content(mine[2], a.catalog.size(mine[2]))
    );
    // Not in this node's slot: unreadable.
    let other = (0..40).find(|id| !mine.contains(id)).unwrap();
    assert!(!held.load(&[other]));
    assert!(held.sample(other).is_none());
}

/// For each packet of `plan`, its payload and its receivers.
fn packet_groups(plan: &CodedPlan) -> impl Iterator<Item = (u64, u32)> + '_ {
    (0..plan.coded.packets.len()).map(|p| {
        (
            plan.payload_len(p) as u64,
            plan.coded.packets[p].entries.len() as u32,
        )
    })
}

#[test]
fn scatter_then_ring_delivers_byte_exact_with_the_models_counts() {
    for sender in [SenderMode::Peers, SenderMode::Extra] {
        let dir = tempfile::tempdir().unwrap();
        let ns = ranks(dir.path(), 4, sender, Broadcast::Ring);
        // Small rounds: several rounds, each with its ring stages.
        let (plans, out) = run_coded(&ns, 1, 3 * 4096, None, |_, _, _| {});
        check_delivered(&ns, &out, 1);
        let plan = &plans[0];
        assert!(plan.coded.packets.iter().any(|p| p.entries.len() >= 3));
        // What went on the wire is what `metfs_shuffle::wire::scatter_ring` counts, packet by packet:
        // payload bytes and messages (scatter frames and forwarded parts).
        let model = packet_groups(plan).fold((0, 0), |(b, m), (len, group)| {
            let s = metfs_shuffle::wire::scatter_ring(len, group);
            (b + s.wire_bytes, m + s.messages)
        });
        let payload: u64 = out.iter().map(|o| o.payload).sum();
        let frames: u64 = out.iter().map(|o| o.frames).sum();
        assert_eq!((payload, frames), model, "{sender:?}");
        // A sender's port carries each packet once; the receivers forward the rest.
        let sent_by_senders: u64 = packet_groups(plan).map(|(len, _)| len).sum();
        let forwarded: u64 = packet_groups(plan)
            .map(|(len, m)| len * u64::from(m - 1))
            .sum();
        assert_eq!(payload, sent_by_senders + forwarded);
        if sender == SenderMode::Extra {
            let x = &out[4];
            assert_eq!(x.payload, sent_by_senders, "the extra rank only scatters");
            assert!(out[..4].iter().all(|o| o.packets == 0));
        }
    }
}

#[test]
fn direct_sending_counts_each_packet_once_per_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let ns = ranks(dir.path(), 4, SenderMode::Peers, Broadcast::Direct);
    let (plans, out) = run_coded(&ns, 1, 3 * 4096, None, |_, _, _| {});
    check_delivered(&ns, &out, 1);
    let (bytes, frames) = packet_groups(&plans[0]).fold((0, 0), |(b, f), (len, m)| {
        (b + len * u64::from(m), f + u64::from(m))
    });
    let payload: u64 = out.iter().map(|o| o.payload).sum();
    let sent: u64 = out.iter().map(|o| o.frames).sum();
    assert_eq!((payload, sent), (bytes, frames));
}

#[test]
fn the_extra_rank_reads_every_operand_from_the_tier_and_the_nodes_only_receive() {
    for broadcast in [Broadcast::Direct, Broadcast::Ring] {
        let dir = tempfile::tempdir().unwrap();
        let ns = ranks(dir.path(), 3, SenderMode::Extra, broadcast);
        assert!(ns[3].is_extra() && ns[3].spec.rank == 3 && ns[3].ranks() == 4);
        let (plans, out) = run_coded(&ns, 1, 3 * 4096, None, |_, _, _| {});
        check_delivered(&ns, &out, 1);
        let plan = &plans[0];
        assert!(plan.senders.iter().all(|&s| s == 3));
        // The extra rank's carpool: no common holder needed, so no more packets than peers'.
        let peers = ranks(&dir.path().join("p"), 3, SenderMode::Peers, broadcast);
        let t = peers[0].transition(1, &[]).unwrap();
        assert!(
            plan.coded.packets.len() <= peers[0].coded_plan(1, &t).unwrap().coded.packets.len()
        );
        // Each operand read once from the tier: the model's tier bytes.
        let model = metfs_shuffle::wire::coded_extra(
            &plan.coded,
            &plan.demands,
            3,
            metfs_shuffle::wire::Fanout::Receivers,
        )
        .unwrap();
        assert_eq!(out[3].tier, model.tier_bytes);
        assert!(out[..3].iter().all(|o| o.tier == 0 && o.packets == 0));
        assert_eq!(out[3].packets as usize, plan.coded.packets.len());
    }
}

#[test]
fn the_extra_rank_sends_uncoded_samples_from_the_tier_and_refuses_a_changed_one() {
    let dir = tempfile::tempdir().unwrap();
    let ns = ranks(dir.path(), 3, SenderMode::Extra, Broadcast::Direct);
    let t = ns[0].transition(1, &[]).unwrap();
    // The nodes send nothing; every sample a node gets from a peer comes from rank 3.
    assert!(ns[..3]
        .iter()
        .all(|n| n.outgoing(&t).iter().all(Vec::is_empty)));
    let lists = ns[3].outgoing(&t);
    assert_eq!(lists.len(), 4);
    for (i, n) in ns[..3].iter().enumerate() {
        let want: Vec<u32> = t.nodes[i].peer.iter().map(|&(s, _)| s).collect();
        assert_eq!(lists[i], want);
        assert!(n.expected(&t).values().all(|&f| f == 3));
    }
    // A sample changed at the source after the catalog: sent as missing, its receiver
    // leaves it to its daemon, the rest arrives.
    let changed = lists[0][0];
    assert!(ns[3].catalog.size(changed) > 0);
    let path = dir.path().join("tier").join(ns[3].catalog.path(changed));
    std::fs::write(&path, b"changed").unwrap();
    let mut inboxes: Vec<Inbox> = ns[..3].iter().map(|n| open_inbox(n, 1)).collect();
    let mut out = Outbox::new(&ns[3], 1, lists.clone()).corrupt_first();
    let mut got = [Accepted::default(); 3];
    while !out.done() {
        for (to, part) in out.round(8192).into_iter().enumerate() {
            if !part.is_empty() {
                got[to] += inboxes[to].accept(&ns[to], 3, &part).unwrap();
            }
        }
    }
    // One refused for the change, and for the injected corruption the first sample to each
    // node unless it has no bytes to flip (node 0's first is the changed one, sent as
    // missing; an empty sample).
    let corrupted = lists[..3]
        .iter()
        .filter(|l| l[0] != changed && ns[3].catalog.size(l[0]) > 0)
        .count();
    assert!(corrupted >= 1);
    let rejected: usize = got.iter().map(|g| g.rejected as usize).sum();
    assert_eq!(rejected, 1 + corrupted);
    let sent: usize = lists.iter().map(Vec::len).sum();
    assert_eq!(
        got.iter().map(|g| g.samples as usize).sum::<usize>(),
        sent - rejected
    );
    // Each distinct sample read once (the changed one not at all).
    let mut distinct: Vec<u32> = lists.iter().flatten().copied().collect();
    distinct.sort_unstable();
    distinct.dedup();
    let bytes: u64 = distinct
        .iter()
        .filter(|&&s| s != changed)
        .map(|&s| ns[3].catalog.size(s))
        .sum();
    assert_eq!(out.tier_bytes(), bytes);
    for (n, inbox) in ns[..3].iter().zip(inboxes) {
        assert_eq!(inbox.missing(), got[n.spec.rank as usize].rejected as usize);
    }
}

#[test]
fn a_corrupted_ring_part_fails_every_receiver_of_its_packet_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let ns = ranks(dir.path(), 3, SenderMode::Extra, Broadcast::Ring);
    let t = ns[0].transition(1, &[]).unwrap();
    let moved: usize = t.nodes.iter().map(|p| p.peer.len()).sum();
    let (_, out) = run_coded(&ns, 1, 3 * 4096, Some(3), |_, _, _| {});
    let rejected: usize = out.iter().map(|o| o.got.rejected as usize).sum();
    // The extra rank corrupted its first part to each of 3 nodes: each corrupted part reaches
    // every receiver of its packet, whose samples then fail their CRC.
    assert!((3..=3 * 3).contains(&rejected), "{out:?}");
    assert_eq!(out.iter().map(|o| o.missing).sum::<usize>(), rejected);
    assert_eq!(
        out.iter().map(|o| o.got.samples as usize).sum::<usize>(),
        moved - rejected
    );
    // A part from a rank that is not the ring's predecessor is refused, and not forwarded.
    let plan = ns[0].coded_plan(1, &t).unwrap();
    let (p, packet) = plan
        .coded
        .packets
        .iter()
        .enumerate()
        .find(|(_, p)| p.entries.len() == 3)
        .unwrap();
    let members: Vec<u32> = packet
        .entries
        .iter()
        .map(|e| plan.demands[e.demand as usize].receiver)
        .collect();
    let me = members[0];
    let not_pred = members[1];
    let len = plan.payload_len(p);
    let n = metfs_shuffle::wire::parts(len as u64, 3).nth(2).unwrap() as u32;
    let mut frame = Vec::new();
    for w in [p as u32, 2, n, 0] {
        frame.extend_from_slice(&w.to_le_bytes());
    }
    frame.resize(RING_HEADER + n as usize, 7);
    let node = &ns[me as usize];
    let mut d = Decoder::new(node, &plan);
    let mut inbox = node.inbox(1, HashMap::new()).unwrap();
    let got = d.accept(&mut inbox, not_pred, &frame).unwrap();
    assert_eq!(got.rejected, 1);
    assert!(!d.has_forwards());
    // From the predecessor it is taken and passed on (it has one hop left).
    let got = d.accept(&mut inbox, members[2], &frame).unwrap();
    assert_eq!(got.rejected, 0);
    assert!(d.has_forwards());
    // Cut short: an error naming the sender.
    let e = d
        .accept(&mut inbox, members[2], &frame[..frame.len() - 1])
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!("rank {}", members[2])),
        "{e}"
    );
}

#[test]
fn the_extra_rank_refuses_a_spec_or_catalog_it_cannot_trust() {
    let dir = tempfile::tempdir().unwrap();
    let ns = nodes(dir.path(), 2, 0.0, &mixed_sizes());
    let spec = std::fs::read(ns[0].spec.slots.parent().unwrap().join(SPEC_FILE)).unwrap();
    let cat = std::fs::read(&ns[0].spec.catalog).unwrap();
    let tier = dir.path().join("tier");
    std::fs::create_dir_all(&tier).unwrap();
    let e = Node::extra(&spec, &cat[..cat.len() / 2], &[], &tier)
        .err()
        .unwrap();
    assert!(e.to_string().contains("rank 0's catalog"), "{e}");
    let other = String::from_utf8(spec.clone())
        .unwrap()
        .replace(&format!("\"v\":{SPEC_VERSION}"), "\"v\":9");
    let e = Node::extra(other.as_bytes(), &cat, &[], &tier)
        .err()
        .unwrap();
    assert!(e.to_string().contains("version 9"), "{e}");
    let e = Node::extra(&spec, &cat, &[], &dir.path().join("nowhere"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a directory"), "{e}");
    let x = Node::extra(&spec, &cat, &[], &tier).unwrap();
    assert!(x.is_extra() && x.spec.rank == 2 && x.sender == SenderMode::Extra);
}

/// `n` reopened with `bytes` as its groups file and `digest` in its spec.
fn with_groups(n: &Node, bytes: &[u8], digest: u64) -> Result<Node, ExchangeError> {
    let cache = n.spec.slots.parent().unwrap();
    let path = cache.join(GROUPS_FILE);
    std::fs::write(&path, bytes).unwrap();
    let mut spec = n.spec.clone();
    spec.groups = Some(GroupsRef {
        path,
        digest: format!("{digest:016x}"),
    });
    std::fs::write(cache.join(SPEC_FILE), serde_json::to_vec(&spec).unwrap()).unwrap();
    Node::open(cache)
}

/// Nodes whose samples are pairs of files plan alike, move each pair from one place and keep
/// the always file local; another grouping is named in the agreement, and a groups file that
/// is not the daemon's is refused, on a node and on the extra rank.
#[test]
fn sample_groups_move_whole_and_other_groups_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = vec![5000u64; 12];
    let ns = nodes(dir.path(), 2, 0.0, &sizes);
    let fp = footprints(&sizes, Staged::Copy);
    let pairs = (0..5).map(|s| vec![2 * s, 2 * s + 1]).collect();
    let bytes = SampleGroups::new(&fp, None, None, pairs, vec![11])
        .unwrap()
        .encode();
    let digest = layouts::groups_digest(&bytes);
    let g: Vec<Node> = ns
        .iter()
        .map(|n| with_groups(n, &bytes, digest).unwrap())
        .collect();
    for epoch in 1..4 {
        let t = g[0].transition(epoch, &[]).unwrap();
        assert_eq!(t, g[1].transition(epoch, &[]).unwrap());
        for plan in &t.nodes {
            assert!(plan.local.contains(&11), "the always file is linked");
            let moved = |f: u32| plan.peer.iter().find(|p| p.0 == f).map(|p| p.1);
            for s in 0..5 {
                assert_eq!(moved(2 * s), moved(2 * s + 1), "pair {s}");
            }
            assert!(!plan.local.contains(&10) && moved(10).is_none());
        }
        assert!(t.nodes.iter().all(|p| p.tier.is_empty()));
    }
    let why = g[0].disagreement(1, &ns[1].agreement()).unwrap();
    assert!(
        why.contains("sample groups digest") && why.contains("--group-by"),
        "{why}"
    );
    let cut = &bytes[..bytes.len() - 4];
    let e = with_groups(&ns[0], cut, digest).err().unwrap().to_string();
    assert!(e.contains("groups.bin") && e.contains("remount"), "{e}");
    let e = with_groups(&ns[0], cut, layouts::groups_digest(cut))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a groups file"), "{e}");
    let spec = serde_json::to_vec(&g[1].spec).unwrap();
    let cat = std::fs::read(&g[1].spec.catalog).unwrap();
    let tier = dir.path().join("tier");
    std::fs::create_dir_all(&tier).unwrap();
    let x = Node::extra(&spec, &cat, &g[1].groups_bytes(), &tier).unwrap();
    assert_eq!(
        x.transition(2, &[]).unwrap(),
        g[0].transition(2, &[]).unwrap()
    );
    let e = Node::extra(&spec, &cat, &[], &tier)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("groups") && e.contains("remount"), "{e}");
}

#[test]
fn an_epochs_slot_and_inbox_are_named_as_the_daemon_names_them() {
    // The daemon's slots are the stager's names; aggregate mode has one mini-epoch per epoch.
    assert_eq!(slot_of_epoch(3), metfs_prefetcher::stager::slot_name(3, 0));
    assert_eq!(slot_of_epoch(3), "e000003-m00000");
    assert_eq!(inbox_of_epoch(12), "inbox-e000012");
    let slots = Path::new("/cache/slots");
    assert_eq!(inbox_dir(slots, 12), slots.join("inbox-e000012"));
    assert_eq!(
        inbox_journal(slots, 12).path(),
        SlotJournal::of(slots, "inbox-e000012").path()
    );
    // The code as the daemon's config and spec spell it.
    for (code, name) in [
        (ShuffleCode::Uncoded, "uncoded"),
        (ShuffleCode::UberShuffle, "uberShuffle"),
    ] {
        assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{name}\""));
        assert_eq!(code.to_string(), name);
    }
}
