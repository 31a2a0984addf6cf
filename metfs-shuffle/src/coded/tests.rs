use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::plan::{layout, transition, AggregateConfig};
use crate::theory;

/// Demands from caches and assignments, as the paper's examples give them.
fn demands_of(caches: &[Vec<u32>], assigned: &[Vec<u32>], len: u64) -> Vec<Demand> {
    let mut out = Vec::new();
    for (i, wants) in assigned.iter().enumerate() {
        for &j in wants {
            if caches[i].contains(&j) {
                continue;
            }
            let holders = NodeSet::from_ranks(
                (0..caches.len() as u32).filter(|&k| caches[k as usize].contains(&j)),
            );
            out.push(Demand {
                sample: j,
                len,
                receiver: i as u32,
                holders,
            });
        }
    }
    out
}

/// The paper's Example 1 (workers 1..3 are ranks 0..2; samples keep their numbers).
fn example() -> Vec<Demand> {
    let caches = vec![vec![2, 3, 4, 8], vec![6, 7, 8, 9], vec![1, 3, 4, 5]];
    let assigned = vec![vec![3, 5, 8], vec![1, 4, 9], vec![2, 6, 7]];
    demands_of(&caches, &assigned, 1)
}

fn sample_of(demands: &[Demand], p: &Point) -> u32 {
    demands[p.demand as usize].sample
}

#[test]
fn example_1_uncoded_needs_six_unicasts() {
    let d = example();
    assert_eq!(d.len(), 6);
    let t = crate::wire::uncoded_extra(&d);
    assert_eq!(t.transmissions, 6);
}

#[test]
fn example_2_tables_give_four_packets() {
    let d = example();
    let t = tables(&d, 1).unwrap();
    assert_eq!(t.packet_count(), 4);
    let layout: Vec<(NodeSet, Vec<Vec<u32>>)> = t
        .tables
        .iter()
        .map(|t| {
            let cols = t
                .columns
                .iter()
                .map(|c| c.iter().map(|p| sample_of(&d, p)).collect());
            (t.members, cols.collect())
        })
        .collect();
    // Fig. 1b: {1,3}: d5 | d2; {2,3}: d1 | d6 d7; {1,2,3}: - | d4 | -.
    assert_eq!(
        layout,
        vec![
            (NodeSet::from_ranks([0, 2]), vec![vec![5], vec![2]]),
            (NodeSet::from_ranks([1, 2]), vec![vec![1], vec![6, 7]]),
            (
                NodeSet::from_ranks([0, 1, 2]),
                vec![vec![], vec![4], vec![]]
            ),
        ]
    );
    for p in t.packets() {
        p.check(&d).unwrap();
    }
}

#[test]
fn example_3_carpool_gives_three_packets_moving_d4_to_table_2_3() {
    let d = example();
    let c = carpool(&d, 1, Sender::Extra).unwrap();
    assert_eq!(c.original_packets, 4);
    assert_eq!(c.packets.len(), 3);
    assert!(!c.fallback);
    let with_d4 = c
        .packets
        .iter()
        .find(|p| p.entries.iter().any(|e| sample_of(&d, e) == 4))
        .unwrap();
    assert_eq!(with_d4.table, NodeSet::from_ranks([1, 2]));
    for p in &c.packets {
        p.check(&d).unwrap();
    }
}

#[test]
fn bad_demands_are_refused() {
    let mut d = example();
    assert_eq!(tables(&d, 0).unwrap_err(), CodeError::ZeroBlock);
    let r = d[0].receiver;
    d[0].holders.insert(r);
    assert!(matches!(
        tables(&d, 1),
        Err(CodeError::ReceiverHolds { .. })
    ));
    let mut d = example();
    d[1].holders = NodeSet::EMPTY;
    assert!(matches!(tables(&d, 1), Err(CodeError::NoHolder { .. })));
    let mut d = example();
    d.push(d[0]);
    assert!(matches!(
        carpool(&d, 1, Sender::Peers),
        Err(CodeError::Duplicate { .. })
    ));
}

/// Runs a coded plan end to end on real bytes: the extra rank (or, in peers mode, a common
/// holder) encodes each packet from what it holds, each receiver decodes with only what it
/// holds, and the reassembled samples must equal the originals.
fn run(
    coded: &Coded,
    demands: &[Demand],
    data: &[Vec<u8>],
    held: &[BTreeMap<u32, Vec<u8>>],
    sender: Sender,
) -> Result<(), TestCaseError> {
    let everything: BTreeMap<u32, Vec<u8>> = data
        .iter()
        .enumerate()
        .map(|(j, v)| (j as u32, v.clone()))
        .collect();
    let nodes = held.len() as u32;
    let mut asm: Vec<Assembler> = (0..nodes)
        .map(|i| Assembler::new(i, demands, coded.block_bytes))
        .collect();
    let mut delivered = 0u64;
    for packet in &coded.packets {
        packet
            .check(demands)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let payload = match sender {
            Sender::Extra => encode(packet, demands, coded.block_bytes, &everything),
            Sender::Peers => {
                let from = packet.common_holders(demands).min();
                prop_assert!(from.is_some(), "a peers packet without a sender");
                encode(
                    packet,
                    demands,
                    coded.block_bytes,
                    &held[from.unwrap() as usize],
                )
            }
        }
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(payload.len(), coded.block_bytes as usize);
        for r in packet.receivers(demands).iter() {
            let (point, block) = decode(
                packet,
                &payload,
                r,
                demands,
                coded.block_bytes,
                &held[r as usize],
            )
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
            asm[r as usize]
                .put(point, &block)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            delivered += 1;
        }
    }
    prop_assert_eq!(delivered, coded.points);
    for (i, a) in asm.into_iter().enumerate() {
        let got = a.finish().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want: BTreeMap<u32, Vec<u8>> = demands
            .iter()
            .filter(|d| d.receiver == i as u32)
            .map(|d| (d.sample, data[d.sample as usize].clone()))
            .collect();
        prop_assert_eq!(got, want, "node {}", i);
    }
    Ok(())
}

/// Samples' bytes, which node holds which sample, which node wants which, the block size.
type Instance = (Vec<Vec<u8>>, Vec<Vec<bool>>, Vec<Vec<bool>>, u32);

/// Random samples of random lengths, random caches, random needs.
fn instance() -> impl Strategy<Value = Instance> {
    (2usize..7, 1usize..40, 1u32..20).prop_flat_map(|(n, q, block)| {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..60), q),
            prop::collection::vec(prop::collection::vec(prop::bool::weighted(0.4), q), n),
            prop::collection::vec(prop::collection::vec(prop::bool::weighted(0.5), q), n),
            Just(block),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn decoding_is_byte_exact_for_random_tables((data, holds, wants, block) in instance()) {
        let n = holds.len();
        let held: Vec<BTreeMap<u32, Vec<u8>>> = holds
            .iter()
            .map(|h| {
                h.iter().enumerate().filter(|(_, &b)| b)
                    .map(|(j, _)| (j as u32, data[j].clone())).collect()
            })
            .collect();
        let mut demands = Vec::new();
        for i in 0..n {
            for j in 0..data.len() {
                let holders = NodeSet::from_ranks((0..n as u32).filter(|&k| holds[k as usize][j]));
                if wants[i][j] && !holds[i][j] && !holders.is_empty() {
                    demands.push(Demand {
                        sample: j as u32,
                        len: data[j].len() as u64,
                        receiver: i as u32,
                        holders,
                    });
                }
            }
        }
        let t = tables(&demands, block).unwrap();
        let original = t.clone().into_coded();
        run(&original, &demands, &data, &held, Sender::Extra)?;
        let extra = carpool(&demands, block, Sender::Extra).unwrap();
        prop_assert!(extra.packets.len() as u64 <= t.packet_count());
        prop_assert_eq!(extra.original_packets, t.packet_count());
        run(&extra, &demands, &data, &held, Sender::Extra)?;
        let peers = carpool(&demands, block, Sender::Peers).unwrap();
        run(&peers, &demands, &data, &held, Sender::Peers)?;
    }
}

#[test]
fn a_receiver_without_an_operand_cannot_decode() {
    let d = example();
    let c = tables(&d, 1).unwrap().into_coded();
    let packet = c.packets.iter().find(|p| p.entries.len() == 2).unwrap();
    let everything: BTreeMap<u32, Vec<u8>> = (0..10).map(|j| (j, vec![j as u8])).collect();
    let payload = encode(packet, &d, 1, &everything).unwrap();
    let r = packet.receivers(&d).min().unwrap();
    let empty = BTreeMap::new();
    assert!(matches!(
        decode(packet, &payload, r, &d, 1, &empty),
        Err(CodecError::Missing { .. })
    ));
    assert_eq!(
        decode(packet, &payload, 7, &d, 1, &everything).unwrap_err(),
        CodecError::NotReceiver { node: 7 }
    );
    assert!(matches!(
        decode(packet, &[0, 0], r, &d, 1, &everything),
        Err(CodecError::Payload { .. })
    ));
}

/// The demands of the transition from epoch 0 to 1 of `q` unit samples on `n` nodes each
/// holding the fraction `alpha` (in expectation), and the `p` used.
pub(crate) fn unit_demands(n: u32, q: u32, alpha: f64, seed: u64) -> (Vec<Demand>, f64) {
    let p = theory::extra_probability(n, alpha).unwrap();
    let sizes = vec![1u64; q as usize];
    let cfg = AggregateConfig {
        nodes: n,
        seed,
        budget: u64::from(q),
        extra: p,
    };
    let a = layout(&sizes, &cfg, 0).unwrap();
    let b = layout(&sizes, &cfg, 1).unwrap();
    let t = transition(Some(&a), &b, &sizes, &[]).unwrap();
    (demands(&a, &t, &sizes).unwrap(), p)
}

#[test]
fn coded_over_uncoded_is_within_5_percent_of_theorem_1_at_n_4() {
    for alpha in [0.25, 0.5, 0.75] {
        let (d, p) = unit_demands(4, 65_536, alpha, 11);
        let uncoded = d.len() as f64;
        let expected_uncoded = theory::uncoded_unicasts(65_536.0, 4, p);
        assert!(
            (uncoded / expected_uncoded - 1.0).abs() < 0.02,
            "α {alpha}: {uncoded}"
        );
        let theory = theory::coded_ratio(4, p);
        let original = tables(&d, 1).unwrap().packet_count() as f64 / uncoded;
        assert!(
            (original / theory - 1.0).abs() < 0.05,
            "α {alpha}: tables {original:.4}, Theorem 1 {theory:.4}"
        );
        // Theorem 1 counts R_c itself too.
        let rc = theory::coded_broadcasts(65_536.0, 4, p);
        let packets = tables(&d, 1).unwrap().packet_count() as f64;
        assert!(
            (packets / rc - 1.0).abs() < 0.05,
            "α {alpha}: {packets} vs R_c {rc:.0}"
        );
        let carpooled = carpool(&d, 1, Sender::Extra).unwrap().packets.len() as f64 / uncoded;
        assert!(
            carpooled <= original && carpooled > 0.95 * theory,
            "α {alpha}: {carpooled:.4}"
        );
    }
}

/// Fig. 3: at n = 20, q = 10^5, α = 0.325 the carpool cuts packets by 2.58x.
#[test]
fn carpool_cuts_packets_at_least_as_much_as_fig_3() {
    let (d, _) = unit_demands(20, 100_000, 0.325, 3);
    let c = carpool(&d, 1, Sender::Extra).unwrap();
    let gain = c.original_packets as f64 / c.packets.len() as f64;
    assert!(
        gain >= 2.58,
        "{} → {} packets: {gain:.3}x",
        c.original_packets,
        c.packets.len()
    );
}

#[test]
fn demands_name_every_live_holder_and_no_dead_one() {
    let sizes: Vec<u64> = (0..3000u64).map(|j| j % 17).collect();
    let cfg = AggregateConfig {
        nodes: 6,
        seed: 21,
        budget: 20_000,
        extra: 0.3,
    };
    let a = layout(&sizes, &cfg, 4).unwrap();
    let b = layout(&sizes, &cfg, 5).unwrap();
    let t = transition(Some(&a), &b, &sizes, &[1]).unwrap();
    let d = demands(&a, &t, &sizes).unwrap();
    let peer_samples: usize = t.nodes.iter().map(|p| p.peer.len()).sum();
    assert_eq!(d.len(), peer_samples);
    for x in &d {
        assert_ne!(x.receiver, 1);
        assert_eq!(x.len, sizes[x.sample as usize]);
        let live = NodeSet::from_ranks((0..6).filter(|&k| k != 1 && a.holds(k, x.sample)));
        assert_eq!(x.holders, live, "sample {}", x.sample);
        assert!(!x.holders.contains(x.receiver));
    }
    let other = layout(&sizes, &AggregateConfig { nodes: 5, ..cfg }, 4).unwrap();
    assert!(matches!(
        demands(&other, &t, &sizes),
        Err(CodeError::Mismatch(_))
    ));
    // Same inputs, same packets.
    let one = carpool(&d, 8, Sender::Extra).unwrap();
    assert_eq!(one, carpool(&d, 8, Sender::Extra).unwrap());
    let wire = crate::wire::uncoded_peers(&t, &sizes).unwrap();
    assert_eq!(wire.wire_bytes, t.peer_bytes());
    assert_eq!(wire.transmissions as usize, peer_samples);
}
