//! One job's samples not drawn yet, as a bitmap with rank counts: the sampler's draw finds the
//! `r`-th of them in constant time, whatever the job's share of the samples.

/// Words per block of a [`Column`]: 512 bits, one cache line.
pub(super) const BLOCK: usize = 8;
/// Blocks per super-block of a [`Column`].
pub(super) const SUPER: usize = 64;

/// One job's samples not drawn yet: a bitmap over local indices with its count per block and
/// per super-block, so that the `r`-th of them is found by reading two short arrays and one
/// cache line of the bitmap; a bit per sample of the sampler whatever the job's share.
#[derive(Debug)]
pub(super) struct Column {
    pub(super) bits: Vec<u64>,
    pub(super) blocks: Vec<u16>,
    pub(super) supers: Vec<u32>,
    pub(super) len: u64,
}

impl Column {
    /// The column of `locals`, all distinct.
    pub(super) fn of(locals: &[u32]) -> Self {
        let top = locals.iter().max().map_or(0, |&l| l as usize / 64 + 1);
        let mut bits = vec![0u64; top];
        for &l in locals {
            bits[l as usize / 64] |= 1 << (l % 64);
        }
        let blocks: Vec<u16> = bits
            .chunks(BLOCK)
            .map(|b| b.iter().map(|w| w.count_ones() as u16).sum())
            .collect();
        let supers = blocks
            .chunks(SUPER)
            .map(|s| s.iter().map(|&b| u32::from(b)).sum())
            .collect();
        Self {
            bits,
            blocks,
            supers,
            len: locals.len() as u64,
        }
    }

    pub(super) fn contains(&self, l: u32) -> bool {
        self.bits
            .get(l as usize / 64)
            .is_some_and(|w| w >> (l % 64) & 1 != 0)
    }

    pub(super) fn remove(&mut self, l: u32) {
        let w = l as usize / 64;
        debug_assert!(self.contains(l));
        self.bits[w] &= !(1 << (l % 64));
        self.blocks[w / BLOCK] -= 1;
        self.supers[w / BLOCK / SUPER] -= 1;
        self.len -= 1;
    }

    /// The `r`-th sample (0-based, ascending), `r < len`.
    pub(super) fn select(&self, r: u64) -> u32 {
        let (b, r) = self.locate(r);
        self.select_in_block(b, r)
    }

    /// The block holding the `r`-th sample and its rank there, from the counts alone (small,
    /// and mostly in cache).
    pub(super) fn locate(&self, mut r: u64) -> (usize, u32) {
        let mut s = 0;
        while r >= u64::from(self.supers[s]) {
            r -= u64::from(self.supers[s]);
            s += 1;
        }
        let mut b = s * SUPER;
        while r >= u64::from(self.blocks[b]) {
            r -= u64::from(self.blocks[b]);
            b += 1;
        }
        (b, r as u32)
    }

    /// Block `b`'s words, zeros past the bitmap's end.
    pub(super) fn block(&self, b: usize) -> [u64; BLOCK] {
        let mut line = [0; BLOCK];
        let words = &self.bits[b * BLOCK..self.bits.len().min((b + 1) * BLOCK)];
        line[..words.len()].copy_from_slice(words);
        line
    }

    /// The `r`-th sample of block `b`.
    pub(super) fn select_in_block(&self, b: usize, r: u32) -> u32 {
        select_in_line(&self.block(b), b, r)
    }

    /// Its samples, ascending.
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let bit = w.trailing_zeros();
                    w &= w - 1;
                    (i * 64) as u32 + bit
                })
            })
        })
    }
}

/// The `r`-th sample of block `b`, whose words are `line`. Nothing branches on the words.
pub(super) fn select_in_line(line: &[u64; BLOCK], b: usize, mut r: u32) -> u32 {
    let (mut at, mut found) = (0, false);
    for &w in line {
        let ones = w.count_ones();
        let past = !found & (r >= ones);
        r -= if past { ones } else { 0 };
        at += usize::from(past);
        found |= !past;
    }
    ((b * BLOCK + at) * 64) as u32 + select_in_word(line[at], r)
}

const BYTES: u64 = 0x0101_0101_0101_0101;

/// The position of the `r`-th set bit of `w` (`r` below its count): the byte by the running
/// counts of its bytes, all eight compared at once, then a table.
pub(super) fn select_in_word(w: u64, r: u32) -> u32 {
    let s = w - ((w >> 1) & 0x5555_5555_5555_5555);
    let s = (s & 0x3333_3333_3333_3333) + ((s >> 2) & 0x3333_3333_3333_3333);
    let counts = (s + (s >> 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    // Byte i: set bits in bytes 0..=i (at most 64, so a byte's top bit stays clear).
    let running = counts.wrapping_mul(BYTES);
    let high = 0x8080_8080_8080_8080u64;
    let at_most_r = (((u64::from(r) * BYTES) | high) - running) & high;
    let byte = ((at_most_r >> 7).wrapping_mul(BYTES) >> 56) as u32;
    let before = ((running << 8) >> (8 * byte)) as u32 & 0xFF;
    let bits = (w >> (8 * byte)) as usize & 0xFF;
    8 * byte + u32::from(SELECT_IN_BYTE[bits][(r - before) as usize])
}

/// `SELECT_IN_BYTE[b][k]`: the position of the `k`-th set bit of byte `b`.
static SELECT_IN_BYTE: [[u8; 8]; 256] = {
    let mut table = [[0u8; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let (mut k, mut bit) = (0, 0);
        while bit < 8 {
            if b >> bit & 1 == 1 {
                table[b][k] = bit as u8;
                k += 1;
            }
            bit += 1;
        }
        b += 1;
    }
    table
};
