//! Encoding a packet (the XOR of its points' blocks) and decoding it at a receiver, which
//! XORs out the points it holds; then reassembling samples from blocks.
//!
//! Block `b` of a sample of `len` bytes is its bytes `b·B .. min((b+1)·B, len)`, zero-padded to
//! `B`. The codec reads samples only through [`Samples`], so a test can give each node exactly
//! what it holds and nothing else: a decode that needed a sample the receiver does not hold
//! fails with [`CodecError::Missing`] instead of succeeding by accident.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use thiserror::Error;

use super::{Demand, Packet, Point};

/// Read access to the samples one node holds (or, for the extra rank, reads from the tier).
pub trait Samples {
    /// The bytes of `sample`, if held.
    fn sample(&self, sample: u32) -> Option<&[u8]>;
}

impl<S: BuildHasher> Samples for HashMap<u32, Vec<u8>, S> {
    fn sample(&self, sample: u32) -> Option<&[u8]> {
        self.get(&sample).map(Vec::as_slice)
    }
}

impl Samples for BTreeMap<u32, Vec<u8>> {
    fn sample(&self, sample: u32) -> Option<&[u8]> {
        self.get(&sample).map(Vec::as_slice)
    }
}

/// Errors of encoding, decoding and reassembly.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodecError {
    /// An operand is not among the samples given.
    #[error("sample {sample} is needed to {what} but is not held")]
    Missing { sample: u32, what: &'static str },
    /// A held sample's length differs from the catalog's.
    #[error("sample {sample} is {found} bytes, the catalog says {expected}")]
    Length {
        sample: u32,
        expected: u64,
        found: u64,
    },
    /// A payload is not one block long.
    #[error("a packet payload is {found} bytes, not one {expected}-byte block")]
    Payload { expected: u32, found: usize },
    /// The node is not a receiver of the packet.
    #[error("node {node} is not a receiver of this packet")]
    NotReceiver { node: u32 },
    /// A block arrived that the assembler does not expect.
    #[error("block {block} of sample {sample} is not one node {node} waits for")]
    Unexpected { sample: u32, block: u32, node: u32 },
    /// Reassembly ended with blocks missing.
    #[error("sample {sample} is missing {missing} of its {blocks} blocks")]
    Incomplete {
        sample: u32,
        missing: u64,
        blocks: u64,
    },
}

/// XORs block `point.block` of its sample into `out` (one block long).
fn xor_block(
    out: &mut [u8],
    point: Point,
    demands: &[Demand],
    samples: &dyn Samples,
    what: &'static str,
) -> Result<(), CodecError> {
    let d = &demands[point.demand as usize];
    let data = samples.sample(d.sample).ok_or(CodecError::Missing {
        sample: d.sample,
        what,
    })?;
    if data.len() as u64 != d.len {
        return Err(CodecError::Length {
            sample: d.sample,
            expected: d.len,
            found: data.len() as u64,
        });
    }
    let block_bytes = out.len();
    let start = (point.block as usize)
        .saturating_mul(block_bytes)
        .min(data.len());
    let end = start.saturating_add(block_bytes).min(data.len());
    for (o, b) in out.iter_mut().zip(&data[start..end]) {
        *o ^= b;
    }
    Ok(())
}

/// The packet's payload: the XOR of its points' blocks, read from `samples` (which must hold
/// every point: the extra rank, or the peer sending it).
pub fn encode(
    packet: &Packet,
    demands: &[Demand],
    block_bytes: u32,
    samples: &dyn Samples,
) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; block_bytes as usize];
    for &p in &packet.entries {
        xor_block(&mut out, p, demands, samples, "encode")?;
    }
    Ok(out)
}

/// Decodes `payload` at `node`: XORs out every other point of the packet, read from what the
/// node holds, and returns the node's point with its block (zero-padded).
pub fn decode(
    packet: &Packet,
    payload: &[u8],
    node: u32,
    demands: &[Demand],
    block_bytes: u32,
    samples: &dyn Samples,
) -> Result<(Point, Vec<u8>), CodecError> {
    if payload.len() != block_bytes as usize {
        return Err(CodecError::Payload {
            expected: block_bytes,
            found: payload.len(),
        });
    }
    let mut out = payload.to_vec();
    let mut mine = None;
    for &p in &packet.entries {
        if demands[p.demand as usize].receiver == node {
            mine = Some(p);
        } else {
            xor_block(&mut out, p, demands, samples, "decode")?;
        }
    }
    let mine = mine.ok_or(CodecError::NotReceiver { node })?;
    Ok((mine, out))
}

/// Reassembles one node's samples from decoded blocks.
#[derive(Debug)]
pub struct Assembler {
    node: u32,
    block_bytes: u32,
    /// By demand index: the sample, its length, its bytes so far, and which blocks arrived.
    pending: BTreeMap<u32, (u32, u64, Vec<u8>, Vec<bool>)>,
}

impl Assembler {
    /// An assembler for the demands of `node`.
    pub fn new(node: u32, demands: &[Demand], block_bytes: u32) -> Self {
        let pending = demands
            .iter()
            .enumerate()
            .filter(|(_, d)| d.receiver == node)
            .map(|(k, d)| {
                let blocks = d.blocks(block_bytes) as usize;
                (
                    k as u32,
                    (
                        d.sample,
                        d.len,
                        vec![0u8; d.len as usize],
                        vec![false; blocks],
                    ),
                )
            })
            .collect();
        Self {
            node,
            block_bytes,
            pending,
        }
    }

    /// Stores one decoded block (its padding is dropped).
    pub fn put(&mut self, point: Point, block: &[u8]) -> Result<(), CodecError> {
        if block.len() != self.block_bytes as usize {
            return Err(CodecError::Payload {
                expected: self.block_bytes,
                found: block.len(),
            });
        }
        let Some((sample, len, data, got)) = self.pending.get_mut(&point.demand) else {
            return Err(CodecError::Unexpected {
                sample: u32::MAX,
                block: point.block,
                node: self.node,
            });
        };
        let b = point.block as usize;
        if b >= got.len() || got[b] {
            return Err(CodecError::Unexpected {
                sample: *sample,
                block: point.block,
                node: self.node,
            });
        }
        got[b] = true;
        let start = b * self.block_bytes as usize;
        let end = (start + self.block_bytes as usize).min(*len as usize);
        data[start..end].copy_from_slice(&block[..end - start]);
        Ok(())
    }

    /// The samples, each exactly its catalog length; fails if a block never arrived.
    pub fn finish(self) -> Result<BTreeMap<u32, Vec<u8>>, CodecError> {
        let mut out = BTreeMap::new();
        for (sample, _, data, got) in self.pending.into_values() {
            let missing = got.iter().filter(|&&g| !g).count() as u64;
            if missing > 0 {
                return Err(CodecError::Incomplete {
                    sample,
                    missing,
                    blocks: got.len() as u64,
                });
            }
            out.insert(sample, data);
        }
        Ok(out)
    }
}
