//! The receiving side of a coded exchange: [`Decoder`], which gathers a packet's parts along
//! its ring (forwarding them on), decodes this node's block of each packet, reassembles the
//! samples block by block and hands each complete one to the inbox.

use std::collections::HashMap;

use metfs_shuffle::coded::{decode, Packet, Point};

use crate::{Accepted, Broadcast, ExchangeError, Held, Inbox, Node};

use super::{point_len, CodedPlan, BLOCK, CODED_HEADER, LOST, RING_HEADER};

/// Packet `p`'s ring: its receivers in order, its payload's length, and the lengths of the
/// parts the payload is cut into (one per member). Empty for a packet not in the plan.
struct Ring {
    members: Vec<u32>,
    len: usize,
    cut: Vec<usize>,
}

fn ring_of(plan: &CodedPlan, p: u32) -> Ring {
    let members: Vec<u32> = plan
        .coded
        .packets
        .get(p as usize)
        .map(|packet| packet.entries.iter().map(|&e| plan.receiver(e)).collect())
        .unwrap_or_default();
    let m = members.len();
    let len = if m > 0 {
        plan.payload_len(p as usize)
    } else {
        0
    };
    let cut = metfs_shuffle::wire::parts(len as u64, m as u64)
        .map(|b| b as usize)
        .collect();
    Ring { members, len, cut }
}

/// This node's block of `packet` (its `point`), decoded from `payload` by XORing out the
/// others' samples, which it reads from `held`; or why it cannot be.
fn decode_point(
    plan: &CodedPlan,
    held: &mut Held,
    me: u32,
    packet: &Packet,
    point: Point,
    payload: &[u8],
) -> Result<Vec<u8>, String> {
    let others: Vec<u32> = packet
        .entries
        .iter()
        .filter(|&&e| e != point)
        .map(|&e| plan.sample(e))
        .collect();
    if !held.load(&others) {
        return Err("this node cannot read a sample it must XOR out".to_string());
    }
    let mut block = payload.to_vec();
    block.resize(BLOCK as usize, 0);
    decode(packet, &block, me, &plan.demands, BLOCK, held)
        .map(|(_, block)| block)
        .map_err(|e| e.to_string())
}

/// One sample being reassembled.
struct Pending {
    crc: Option<u32>,
    data: Vec<u8>,
    got: Vec<bool>,
    left: usize,
    /// Complete (and handed to the inbox) or given up: later frames for it are ignored.
    closed: bool,
}

/// One packet being gathered from its parts (scatter-then-ring).
struct Gathering {
    payload: Vec<u8>,
    have: Vec<bool>,
    left: usize,
    /// This receiver's sample's CRC, from the sender's scatter frame.
    crc: Option<u32>,
    /// Decoded, or given up.
    done: bool,
}

/// One node's side of receiving coded packets (module docs).
pub struct Decoder<'a> {
    node: &'a Node,
    plan: &'a CodedPlan,
    held: Held<'a>,
    me: u32,
    /// By demand index.
    pending: HashMap<u32, Pending>,
    /// Scatter-then-ring: packets being gathered, and the parts to forward in the next stage,
    /// by rank.
    broadcast: Broadcast,
    gathering: HashMap<u32, Gathering>,
    forward: Vec<Vec<u8>>,
    /// Blocks decoded so far.
    pub blocks: u64,
    /// Parts forwarded along rings, and their payload bytes.
    pub forwarded: u64,
    pub forwarded_bytes: u64,
}

impl<'a> Decoder<'a> {
    /// Decodes with this node's slot of epoch `plan.epoch − 1`.
    pub fn new(node: &'a Node, plan: &'a CodedPlan) -> Self {
        Self {
            node,
            plan,
            held: Held::open(node, plan.epoch.saturating_sub(1), Held::DEFAULT_CAP),
            me: node.spec.rank,
            pending: HashMap::new(),
            broadcast: node.broadcast,
            gathering: HashMap::new(),
            forward: vec![Vec::new(); node.ranks() as usize],
            blocks: 0,
            forwarded: 0,
            forwarded_bytes: 0,
        }
    }

    /// The parts to forward in the next ring stage, by rank (empty for direct sending);
    /// taking them empties the queue.
    pub fn forwards(&mut self) -> Vec<Vec<u8>> {
        let n = self.forward.len();
        std::mem::replace(&mut self.forward, vec![Vec::new(); n])
    }

    /// Whether a ring stage has anything of this node's to forward.
    pub fn has_forwards(&self) -> bool {
        self.forward.iter().any(|f| !f.is_empty())
    }

    /// Decodes the frames of `part`, sent by rank `from`, and hands each sample it completes
    /// to `inbox`.
    pub fn accept(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        part: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        if self.broadcast == Broadcast::Ring {
            return self.accept_ring(inbox, from, part);
        }
        self.accept_direct(inbox, from, part)
    }

    fn accept_direct(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        mut part: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let mut got = Accepted::default();
        while !part.is_empty() {
            let (head, rest) = crate::take(part, CODED_HEADER, from)?;
            let word = |k: usize| u32::from_le_bytes(head[k..k + 4].try_into().expect("4 bytes"));
            let (p, len, crc) = (word(0), word(4), word(8));
            let body = if len == LOST { 0 } else { len as usize };
            let (payload, rest) = crate::take(rest, body, from)?;
            part = rest;
            self.frame(inbox, from, p, len, crc, payload, &mut got)?;
        }
        Ok(got)
    }

    fn accept_ring(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        mut part: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let mut got = Accepted::default();
        while !part.is_empty() {
            let (head, rest) = crate::take(part, RING_HEADER, from)?;
            let word = |k: usize| u32::from_le_bytes(head[k..k + 4].try_into().expect("4 bytes"));
            let (p, k, n, crc) = (word(0), word(4), word(8), word(12));
            let body = if n == LOST { 0 } else { n as usize };
            let (bytes, rest) = crate::take(rest, body, from)?;
            part = rest;
            self.ring_frame(inbox, from, p, k, n, crc, bytes, &mut got)?;
        }
        Ok(got)
    }

    /// One part `k` of packet `p`: from the packet's sender if it is this node's own part
    /// (with its CRC), else from this node's predecessor on the packet's ring. Forwards it to
    /// the successor unless the successor is where it started; decodes the packet once every
    /// part is in.
    #[allow(clippy::too_many_arguments)]
    fn ring_frame(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        p: u32,
        k: u32,
        n: u32,
        crc: u32,
        bytes: &[u8],
        got: &mut Accepted,
    ) -> Result<(), ExchangeError> {
        let plan = self.plan;
        let Ring { members, len, cut } = ring_of(plan, p);
        let m = members.len();
        let pos = members.iter().position(|&r| r == self.me);
        let valid = pos.filter(|&pos| {
            let k = k as usize;
            let expected_from = if k == pos {
                plan.senders[p as usize]
            } else {
                members[(pos + m - 1) % m]
            };
            k < m && from == expected_from && (n == LOST && k == pos || n as usize == cut[k])
        });
        let Some(pos) = valid else {
            tracing::warn!(
                packet = p,
                part = k,
                from,
                "a part of a coded packet this node does not expect from that rank; ignored"
            );
            got.rejected += 1;
            return Ok(());
        };
        let k = k as usize;
        let sender = plan.senders[p as usize];
        if n == LOST {
            return self.lost_packet(inbox, sender, p, got);
        }
        let g = self.gathering.entry(p).or_insert_with(|| Gathering {
            payload: vec![0; len],
            have: vec![false; m],
            left: m,
            crc: None,
            done: false,
        });
        if g.done || g.have[k] {
            if !g.done {
                tracing::warn!(
                    packet = p,
                    part = k,
                    from,
                    "a part arrived twice; kept the first"
                );
            }
            return Ok(());
        }
        // Part `k` started at member `k` and has made `(pos − k) mod m` hops: it goes on
        // until the member before `k` has it.
        if (pos + m - k) % m < m - 1 {
            let next = &mut self.forward[members[(pos + 1) % m] as usize];
            next.extend_from_slice(&p.to_le_bytes());
            next.extend_from_slice(&(k as u32).to_le_bytes());
            next.extend_from_slice(&n.to_le_bytes());
            next.extend_from_slice(&0u32.to_le_bytes());
            next.extend_from_slice(bytes);
            self.forwarded += 1;
            self.forwarded_bytes += bytes.len() as u64;
        }
        let start: usize = cut[..k].iter().sum();
        g.payload[start..start + bytes.len()].copy_from_slice(bytes);
        g.have[k] = true;
        g.left -= 1;
        if k == pos {
            g.crc = Some(crc);
        }
        if g.left == 0 {
            g.done = true;
            let payload = std::mem::take(&mut g.payload);
            let crc = g.crc.expect("this node's own part is in");
            self.frame(inbox, sender, p, len as u32, crc, &payload, got)?;
        }
        Ok(())
    }

    /// Packet `p`'s sender could not encode it: gives it up (once) and passes the loss on
    /// as a frame of its own.
    fn lost_packet(
        &mut self,
        inbox: &mut Inbox,
        sender: u32,
        p: u32,
        got: &mut Accepted,
    ) -> Result<(), ExchangeError> {
        let done = self.gathering.get(&p).is_some_and(|g| g.done);
        if !done {
            self.gathering.insert(
                p,
                Gathering {
                    payload: Vec::new(),
                    have: Vec::new(),
                    left: 0,
                    crc: None,
                    done: true,
                },
            );
            self.frame(inbox, sender, p, LOST, 0, &[], got)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn frame(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        p: u32,
        len: u32,
        crc: u32,
        payload: &[u8],
        got: &mut Accepted,
    ) -> Result<(), ExchangeError> {
        let plan = self.plan;
        let me = self.me;
        let packet = plan
            .coded
            .packets
            .get(p as usize)
            .filter(|_| plan.senders[p as usize] == from);
        let Some((packet, point)) = packet.and_then(|packet| {
            let point = packet.entries.iter().find(|&&e| plan.receiver(e) == me)?;
            Some((packet, *point))
        }) else {
            tracing::warn!(
                packet = p,
                from,
                "a coded frame this node does not expect from that rank; ignored"
            );
            got.rejected += 1;
            return Ok(());
        };
        let d = plan.demands[point.demand as usize];
        let state = self.pending.entry(point.demand).or_insert_with(|| Pending {
            crc: None,
            data: vec![0; d.len as usize],
            got: vec![false; d.blocks(BLOCK) as usize],
            left: d.blocks(BLOCK) as usize,
            closed: false,
        });
        if state.closed {
            return Ok(());
        }
        let expected_len = plan.payload_len(p as usize);
        let why = if len == LOST {
            Some("the sender could not read an operand".to_string())
        } else if len as usize != expected_len {
            Some(format!(
                "a payload of {len} bytes, the plan's is {expected_len}"
            ))
        } else if *state.crc.get_or_insert(crc) != crc {
            Some("its packets disagree on its CRC".to_string())
        } else {
            match decode_point(plan, &mut self.held, me, packet, point, payload) {
                Ok(block) => {
                    let b = point.block as usize;
                    if state.got[b] {
                        tracing::warn!(
                            sample = d.sample,
                            block = b,
                            from,
                            "a block arrived twice; kept the first"
                        );
                        return Ok(());
                    }
                    state.got[b] = true;
                    state.left -= 1;
                    self.blocks += 1;
                    let start = b * BLOCK as usize;
                    let n = point_len(&d, point);
                    state.data[start..start + n].copy_from_slice(&block[..n]);
                    None
                }
                Err(why) => Some(why),
            }
        };
        if let Some(why) = why {
            tracing::warn!(
                sample = %self.node.path_of(d.sample),
                packet = p,
                from,
                "a sample cannot be decoded ({why}); the tier serves it"
            );
            state.closed = true;
            state.data = Vec::new();
            got.rejected += 1;
            return Ok(());
        }
        if state.left == 0 {
            state.closed = true;
            let data = std::mem::take(&mut state.data);
            let crc = state.crc.expect("set by its first frame");
            *got += inbox.accept_decoded(self.node, d.sample, crc, &data)?;
        }
        Ok(())
    }

    /// Samples some of whose blocks never arrived (left to the tier).
    pub fn incomplete(&self) -> usize {
        let expected = self.plan.decoded_for(self.me).count();
        let closed = self.pending.values().filter(|s| s.closed).count();
        expected - closed
    }
}
