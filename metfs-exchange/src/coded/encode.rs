//! The sending side of a coded exchange: [`Encoder`], which encodes this node's packets from
//! what its slot holds (the extra rank: from the tier) and frames them round by round, whole to
//! each receiver or scattered in parts for the rings.

use metfs_shuffle::coded::{encode, Packet};

use crate::{Broadcast, Held, Node};

use super::{CodedPlan, BLOCK, CODED_HEADER, LOST, RING_HEADER};

/// The packets one node sends, encoded and framed round by round.
pub struct Encoder<'a> {
    plan: &'a CodedPlan,
    held: Held<'a>,
    /// The packets this node sends, in plan order, and how many are sent.
    mine: Vec<u32>,
    at: usize,
    ranks: usize,
    broadcast: Broadcast,
    /// Fault injection: the peers whose first frame is still to be corrupted.
    corrupt: Vec<bool>,
    /// Packets sent so far (each once), and their payload bytes.
    pub packets: u64,
    pub packet_bytes: u64,
    /// Frames sent (a whole packet to one receiver, or one part of it), and their payload.
    pub frames: u64,
    pub frame_bytes: u64,
}

impl<'a> Encoder<'a> {
    /// This node's packets of `plan`, their operands read from its slot of epoch
    /// `plan.epoch − 1` (the extra rank: from the tier).
    pub fn new(node: &'a Node, plan: &'a CodedPlan) -> Self {
        let me = node.spec.rank;
        let mine = (0..plan.senders.len() as u32)
            .filter(|&p| plan.senders[p as usize] == me)
            .collect();
        Self {
            plan,
            held: Held::open(node, plan.epoch.saturating_sub(1), Held::DEFAULT_CAP),
            mine,
            at: 0,
            ranks: node.ranks() as usize,
            broadcast: node.broadcast,
            corrupt: Vec::new(),
            packets: 0,
            packet_bytes: 0,
            frames: 0,
            frame_bytes: 0,
        }
    }

    /// Fault injection for tests: flips a payload byte of the first frame (with payload)
    /// sent to each peer.
    pub fn corrupt_first(mut self) -> Self {
        self.corrupt = vec![true; self.ranks];
        self
    }

    /// This round's frames to each rank: packets in plan order, each encoded once and framed
    /// for each of its receivers (whole, or its part for a ring), until the next would take
    /// a part past `max_bytes` (a part holds at least one frame).
    pub fn round(&mut self, max_bytes: usize) -> Vec<Vec<u8>> {
        let plan = self.plan;
        let ring = self.broadcast == Broadcast::Ring;
        let header = if ring { RING_HEADER } else { CODED_HEADER };
        let mut parts = vec![Vec::new(); self.ranks];
        while let Some(&p) = self.mine.get(self.at) {
            let packet = &plan.coded.packets[p as usize];
            let len = plan.payload_len(p as usize);
            // What each receiver (by ascending rank, the ring's order) gets of the payload.
            let cut: Vec<usize> = if ring {
                metfs_shuffle::wire::parts(len as u64, packet.entries.len() as u64)
                    .map(|b| b as usize)
                    .collect()
            } else {
                vec![len; packet.entries.len()]
            };
            let full = packet.entries.iter().zip(&cut).any(|(&e, &n)| {
                let part: &Vec<u8> = &parts[plan.receiver(e) as usize];
                !part.is_empty() && part.len() + header + n > max_bytes
            });
            if full {
                break;
            }
            let payload = self.encode(packet);
            if payload.is_some() {
                self.packets += 1;
                self.packet_bytes += len as u64;
            }
            let mut offset = 0;
            for (k, (&e, &n)) in packet.entries.iter().zip(&cut).enumerate() {
                let r = plan.receiver(e) as usize;
                let part = &mut parts[r];
                part.extend_from_slice(&p.to_le_bytes());
                if ring {
                    part.extend_from_slice(&(k as u32).to_le_bytes());
                }
                self.frames += 1;
                match &payload {
                    Some(b) => {
                        let crc = self
                            .held
                            .crc(plan.sample(e))
                            .expect("loaded samples are journaled");
                        part.extend_from_slice(&(n as u32).to_le_bytes());
                        part.extend_from_slice(&crc.to_le_bytes());
                        let at = part.len();
                        let bytes = if ring {
                            &b[offset..offset + n]
                        } else {
                            &b[..n]
                        };
                        part.extend_from_slice(bytes);
                        offset += n;
                        self.frame_bytes += n as u64;
                        if self.corrupt.get(r).copied().unwrap_or(false) && n > 0 {
                            part[at] ^= 0xff;
                            self.corrupt[r] = false;
                        }
                    }
                    None => {
                        part.extend_from_slice(&LOST.to_le_bytes());
                        part.extend_from_slice(&0u32.to_le_bytes());
                    }
                }
            }
            self.at += 1;
        }
        parts
    }

    /// The payload of `packet` (a whole block), or `None` when an operand is unreadable.
    fn encode(&mut self, packet: &Packet) -> Option<Vec<u8>> {
        let plan = self.plan;
        let ids: Vec<u32> = packet.entries.iter().map(|&e| plan.sample(e)).collect();
        let why = if self.held.load(&ids) {
            match encode(packet, &plan.demands, BLOCK, &self.held) {
                Ok(b) => return Some(b),
                Err(e) => e.to_string(),
            }
        } else {
            "an operand is not in this node's slot or its journal (or the extra rank's tier)"
                .to_string()
        };
        tracing::warn!(
            epoch = plan.epoch,
            samples = ?ids,
            "cannot encode a coded packet ({why}); its receivers get these samples from the tier"
        );
        None
    }

    /// Bytes read from the tier (the extra rank).
    pub fn tier_bytes(&self) -> u64 {
        self.held.tier_bytes()
    }

    /// Whether every packet has been sent.
    pub fn done(&self) -> bool {
        self.at >= self.mine.len()
    }
}
