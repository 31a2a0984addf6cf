//! Coded against uncoded exchange on the wire, next to Theorem 1's prediction.
//!
//! For n = 4 (q = 65,536 samples) and n = 20 (q = 100,000), and for α = 1/n, 0.5 and 0.75,
//! lays out two epochs with the planner (each node keeps samples outside its share with
//! `p = (α − 1/n)/(1 − 1/n)`), plans the transition, and counts each scheme message by
//! message. Samples are one 64 KiB block each, so packets and unicasts are comparable
//! one for one; a last table cuts samples of mixed sizes into 64 KiB blocks.
//!
//! `cargo run --release -p metfs-shuffle --example wire`

use std::time::Instant;

use metfs_shuffle::coded::{carpool, demands, tables, Demand, Sender};
use metfs_shuffle::plan::{layout, transition, AggregateConfig, Transition};
use metfs_shuffle::theory;
use metfs_shuffle::wire::{
    coded_extra, coded_peers, uncoded_extra, uncoded_peers, Fanout, Traffic,
};

const BLOCK: u32 = 64 * 1024;

struct Case {
    demands: Vec<Demand>,
    transition: Transition,
    sizes: Vec<u64>,
    p: f64,
    alpha: f64,
}

fn case(n: u32, sizes: Vec<u64>, alpha: f64, seed: u64) -> Case {
    let p = theory::extra_probability(n, alpha).expect("α ≥ 1/n");
    let cfg = AggregateConfig {
        nodes: n,
        seed,
        budget: sizes.iter().sum(),
        extra: p,
    };
    let a = layout(&sizes, &cfg, 0).expect("layout");
    let b = layout(&sizes, &cfg, 1).expect("layout");
    let t = transition(Some(&a), &b, &sizes, &[]).expect("transition");
    let alpha = (0..n).map(|i| a.alpha(i)).sum::<f64>() / f64::from(n);
    Case {
        demands: demands(&a, &t, &sizes).expect("demands"),
        transition: t,
        sizes,
        p,
        alpha,
    }
}

fn mib(b: u64) -> String {
    format!("{:.0}", b as f64 / (1024.0 * 1024.0))
}

fn main() {
    println!("# Peer exchange between epochs 0 and 1: coded (UberShuffle) against uncoded\n");
    println!("Samples of one 64 KiB block; MiB are payload bytes. `tx` is the paper's unit:");
    println!("packets (coded) or unicasts (uncoded). Theorem 1 predicts coded/uncoded tx.\n");
    println!(
        "| n | q | α target | α held | uncoded tx | tables tx | carpool tx | tables/uncoded \
         | carpool/uncoded | Theorem 1 | carpool gain | plan s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut wires = Vec::new();
    for (n, q) in [(4u32, 65_536u32), (20, 100_000)] {
        for alpha in [1.0 / f64::from(n), 0.5, 0.75] {
            let c = case(n, vec![u64::from(BLOCK); q as usize], alpha, 7);
            let started = Instant::now();
            let t = tables(&c.demands, BLOCK).expect("tables");
            let extra = carpool(&c.demands, BLOCK, Sender::Extra).expect("carpool");
            let peers = carpool(&c.demands, BLOCK, Sender::Peers).expect("carpool");
            let secs = started.elapsed().as_secs_f64();
            let uncoded = c.demands.len() as f64;
            println!(
                "| {n} | {q} | {alpha:.3} | {:.3} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.2}x | {secs:.1} |",
                c.alpha,
                c.demands.len(),
                t.packet_count(),
                extra.packets.len(),
                t.packet_count() as f64 / uncoded,
                extra.packets.len() as f64 / uncoded,
                theory::coded_ratio(n, c.p),
                t.packet_count() as f64 / extra.packets.len() as f64,
            );
            let rows = [
                (
                    "uncoded, peers",
                    uncoded_peers(&c.transition, &c.sizes).expect("uncoded"),
                ),
                ("uncoded, extra rank", uncoded_extra(&c.demands)),
                (
                    "coded, extra rank, to receivers",
                    coded_extra(&extra, &c.demands, n, Fanout::Receivers).expect("coded"),
                ),
                (
                    "coded, extra rank, to all (paper)",
                    coded_extra(&extra, &c.demands, n, Fanout::All).expect("coded"),
                ),
                (
                    "coded, peers",
                    coded_peers(&peers, &c.demands, n).expect("peers").0,
                ),
            ];
            wires.push((n, alpha, c.p, rows));
        }
    }

    println!("\n## Wire cost per scheme\n");
    println!(
        "Busiest port: the larger direction of the busiest rank, a lower bound on the time \
         at link bandwidth. Theorem 1 × uncoded: the coded scheme's predicted port bytes at \
         the extra rank.\n"
    );
    println!("| n | α | scheme | tx | wire MiB | messages | tier MiB | busiest port MiB | Theorem 1 × uncoded MiB |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (n, alpha, p, rows) in &wires {
        let base: &Traffic = &rows[1].1;
        let predicted = theory::coded_ratio(*n, *p) * base.busiest_port_bytes as f64;
        for (name, t) in rows {
            let theory = if name.starts_with("coded, extra") {
                format!("{:.0}", predicted / (1024.0 * 1024.0))
            } else {
                String::new()
            };
            println!(
                "| {n} | {alpha:.3} | {name} | {} | {} | {} | {} | {} | {theory} |",
                t.transmissions,
                mib(t.wire_bytes),
                t.messages,
                mib(t.tier_bytes),
                mib(t.busiest_port_bytes),
            );
        }
    }

    println!("\n## Fig. 3's point: n = 20, q = 10^5, α = 0.325\n");
    let c = case(20, vec![u64::from(BLOCK); 100_000], 0.325, 3);
    let extra = carpool(&c.demands, BLOCK, Sender::Extra).expect("carpool");
    println!(
        "tables {} packets, carpool {} packets: {:.2}x fewer (the paper reports 2.58x); \
         uncoded {} unicasts, Theorem 1 predicts {:.0} packets\n",
        extra.original_packets,
        extra.packets.len(),
        extra.original_packets as f64 / extra.packets.len() as f64,
        c.demands.len(),
        theory::coded_broadcasts(100_000.0, 20, c.p),
    );

    println!("## Mixed sizes (16–112 KiB, mean 64 KiB), n = 4, α = 0.5, by coding block\n");
    let sizes: Vec<u64> = (0..65_536u64)
        .map(|j| 16 * 1024 + (j.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % (96 * 1024))
        .collect();
    let c = case(4, sizes, 0.5, 7);
    let uncoded = uncoded_peers(&c.transition, &c.sizes).expect("uncoded");
    let port_uncoded_extra = uncoded_extra(&c.demands).busiest_port_bytes;
    println!(
        "{} samples to move: uncoded peers {} MiB on the wire, busiest port {} MiB; uncoded \
         from the extra rank, busiest port {} MiB.\n",
        c.demands.len(),
        mib(uncoded.wire_bytes),
        mib(uncoded.busiest_port_bytes),
        mib(port_uncoded_extra),
    );
    println!(
        "| block | points | packets | coded wire MiB (padding included) | extra rank's port MiB |"
    );
    println!("|---|---|---|---|---|");
    for block in [4 * 1024, BLOCK] {
        let extra = carpool(&c.demands, block, Sender::Extra).expect("carpool");
        let coded = coded_extra(&extra, &c.demands, 4, Fanout::Receivers).expect("coded");
        println!(
            "| {} KiB | {} | {} | {} | {} |",
            block / 1024,
            extra.points,
            extra.packets.len(),
            mib(coded.wire_bytes),
            mib(coded.busiest_port_bytes),
        );
    }
}
