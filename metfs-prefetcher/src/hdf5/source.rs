//! Reading rows of a source dataset into a block buffer, and read-ahead hints for them.

use hdf5_sys::h5i::hid_t;

use super::containers::DatasetInfo;
use super::ffi::io::{bytes_mut, read, will_need, Obj};
use super::ffi::space::{runs, select_all, select_hyperslab, simple_space};
use super::ffi::{chunk_range, dataset_offset, Cx};
use super::{Result, BLOCK_BYTES};

/// One source row dataset, open for reading rows into a block buffer.
pub(super) struct Source<'a> {
    pub(super) cx: Cx<'a>,
    pub(super) d: hid_t,
    /// Memory type: a copy of the file type, so nothing is converted.
    pub(super) t: hid_t,
    pub(super) fspace: hid_t,
    pub(super) ds: &'a DatasetInfo,
    /// Rows of the source dataset.
    pub(super) rows: u64,
    /// Bytes of one row in memory.
    pub(super) mem_row: u64,
}

impl Source<'_> {
    /// Selects rows `[r0, r0 + n)` of `space` (rank of the dataset, whole trailing extent).
    pub(super) fn select(&self, space: hid_t, r0: u64, n: u64) -> Result<()> {
        let rank = self.ds.trailing.len() + 1;
        let mut start = vec![0; rank];
        start[0] = r0;
        let mut block = vec![n; rank];
        block[1..].copy_from_slice(&self.ds.trailing);
        select_hyperslab(
            self.cx,
            || format!("select rows of `{}`", self.ds.name),
            space,
            &start,
            &vec![1; rank],
            Some(&block),
        )
    }

    /// Reads the selection of the source's file space into the selection of `mspace`, whose
    /// extent `buf` holds.
    pub(super) fn read(
        &self,
        mspace: hid_t,
        buf: &mut [u64],
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let obj = Obj::Dataset {
            d: self.d,
            mspace: Some(mspace),
            fspace: Some(self.fspace),
        };
        read(self.cx, what, obj, self.t, buf)
    }

    /// Reads `part` into consecutive rows of `buf`, one read per run of neighbouring rows,
    /// each a single regular hyperslab. A union of runs in one read would be one call, but
    /// HDF5 1.10 maps an irregular selection onto chunks element by element, which costs 200
    /// times the CPU of the copy. `mspace` is the buffer's dataspace (`part.len()` rows); it
    /// is left with everything selected.
    pub(super) fn read_runs(&self, part: &[u64], mspace: hid_t, buf: &mut [u64]) -> Result<()> {
        let mut at = 0u64;
        for (r0, n) in runs(part) {
            self.select(self.fspace, r0, n)?;
            self.select(mspace, at, n)?;
            self.read(mspace, buf, || {
                format!("read rows {r0}..{} of `{}`", r0 + n, self.ds.name)
            })?;
            at += n;
        }
        select_all(mspace);
        Ok(())
    }

    /// Reads `part` into consecutive rows of `buf` for a compressed source with chunks of `c0`
    /// rows: each span of neighbouring chunks holding selected rows is read whole (so every
    /// chunk is decompressed once, with no chunk cache) into `scratch`, at most
    /// [`BLOCK_BYTES`] (or one chunk) at a time, and the selected rows copied out. Chunks with
    /// no selected row are not read.
    pub(super) fn read_spans(
        &self,
        part: &[u64],
        c0: u64,
        buf: &mut [u64],
        scratch: &mut Vec<u64>,
    ) -> Result<()> {
        let row = self.mem_row as usize;
        let piece = ((BLOCK_BYTES as u64 / self.mem_row.max(1)) / c0 * c0).max(c0);
        let mut i = 0;
        let mut at = 0usize;
        while i < part.len() {
            let first = part[i] / c0;
            let s = first * c0;
            let mut last = first;
            let mut j = i;
            while j < part.len() {
                let ci = part[j] / c0;
                if ci > last + 1 || (ci + 1) * c0 - s > piece {
                    break;
                }
                last = ci;
                j += 1;
            }
            let e = ((last + 1) * c0).min(self.rows);
            let need = ((e - s) as usize * row).div_ceil(8);
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let mut mdims = vec![e - s];
            mdims.extend_from_slice(&self.ds.trailing);
            let mspace = simple_space(self.cx, &mdims, None)?;
            self.select(self.fspace, s, e - s)?;
            self.read(mspace.0, scratch, || {
                format!("read rows {s}..{e} of `{}`", self.ds.name)
            })?;
            let (src, dst) = (bytes_mut(scratch), bytes_mut(buf));
            for &r in &part[i..j] {
                let from = (r - s) as usize * row;
                dst[at * row..(at + 1) * row].copy_from_slice(&src[from..from + row]);
                at += 1;
            }
            i = j;
        }
        Ok(())
    }
}

/// Plain descriptors of the source and output files, beside HDF5's own: for read-ahead hints
/// on the source and early writeback of the output.
pub(super) struct Fds {
    pub(super) src: std::fs::File,
    pub(super) out: std::fs::File,
}

/// Where a row dataset's rows lie in the source file, for read-ahead hints.
pub(super) enum Placement {
    /// Contiguous storage at this file offset: row `r` at `offset + r * row bytes`.
    Contiguous(u64),
    /// Uncompressed chunks spanning whole rows: a row's bytes are contiguous in its chunk.
    RowChunks,
    /// Other chunked storage: a row's bytes are spread over whole chunks.
    Chunks,
    /// Compact storage, unallocated storage or variable-length data (in the global heap):
    /// nothing worth a hint.
    None,
}

pub(super) fn placement(d: hid_t, ds: &DatasetInfo) -> Placement {
    if ds.vlen {
        return Placement::None;
    }
    match &ds.chunk {
        None => dataset_offset(d).map_or(Placement::None, Placement::Contiguous),
        Some(c) if ds.filters.is_empty() && c[1..] == ds.trailing[..] => Placement::RowChunks,
        Some(_) => Placement::Chunks,
    }
}

/// Asks the kernel to start reading the source bytes of `rows` (ascending) now, so that many
/// reads are in flight at once instead of HDF5's one at a time. Advisory: failures are
/// ignored, and the reads that follow are correct either way.
pub(super) fn hint_rows(
    d: hid_t,
    ds: &DatasetInfo,
    placement: &Placement,
    rows: &[u64],
    fd: &std::fs::File,
) {
    let row_bytes = ds.trailing.iter().product::<u64>() * ds.elem_size;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    match placement {
        Placement::None => return,
        Placement::Contiguous(base) => {
            for (r0, n) in runs(rows) {
                ranges.push((base + r0 * row_bytes, n * row_bytes));
            }
        }
        Placement::RowChunks => {
            let c0 = ds.chunk.as_ref().map_or(1, |c| c[0]).max(1);
            let mut coord = vec![0u64; ds.trailing.len() + 1];
            let mut last: Option<(u64, Option<(u64, u64)>)> = None;
            for (r0, n) in runs(rows) {
                let mut r = r0;
                while r < r0 + n {
                    let ci = r / c0;
                    let end = ((ci + 1) * c0).min(r0 + n);
                    let chunk = match last {
                        Some((i, c)) if i == ci => c,
                        _ => {
                            coord[0] = ci * c0;
                            let c = chunk_range(d, &coord);
                            last = Some((ci, c));
                            c
                        }
                    };
                    if let Some((addr, _)) = chunk {
                        ranges.push((addr + (r - ci * c0) * row_bytes, (end - r) * row_bytes));
                    }
                    r = end;
                }
            }
        }
        Placement::Chunks => {
            let Some(chunk) = ds.chunk.as_ref() else {
                return;
            };
            let c0 = chunk[0].max(1);
            // Chunk grid positions across the trailing dimensions.
            let grid: Vec<u64> = ds
                .trailing
                .iter()
                .zip(&chunk[1..])
                .map(|(&t, &c)| t.div_ceil(c.max(1)))
                .collect();
            let per_row: u64 = grid.iter().product();
            let mut last_ci = None;
            for &r in rows {
                let ci = r / c0;
                if last_ci == Some(ci) {
                    continue;
                }
                last_ci = Some(ci);
                for k in 0..per_row {
                    let mut coord = vec![ci * c0];
                    let mut rest = k;
                    for (g, c) in grid.iter().zip(&chunk[1..]).rev() {
                        coord.push((rest % g) * c);
                        rest /= g;
                    }
                    coord[1..].reverse();
                    if let Some(rng) = chunk_range(d, &coord) {
                        ranges.push(rng);
                    }
                }
            }
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (o, l) in ranges {
        match merged.last_mut() {
            Some((mo, ml)) if *mo + *ml >= o => *ml = (*ml).max(o + l - *mo),
            _ => merged.push((o, l)),
        }
    }
    for (o, l) in merged {
        will_need(fd, o, l);
    }
}
