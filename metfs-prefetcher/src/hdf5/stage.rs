//! Staging: a new HDF5 file holding one mini-epoch's rows of one container.

use std::path::Path;

use hdf5_sys::h5d::H5D_layout_t;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::H5S_UNLIMITED;

use super::containers::{ContainerFile, Containers, DatasetInfo};
use super::ffi::attrs::{
    attr_count, attr_name, attr_space, attr_type, copy_attr, open_attr_by_idx,
};
use super::ffi::io::{write, RowCopy};
use super::ffi::space::{max_dims, select_all, select_hyperslab, simple_space, space_dims};
use super::ffi::types::{native, std_u64le, type_copy, type_traits, Native};
use super::ffi::{
    copy_object, copy_plist, create_dataset, create_file, create_group_like,
    dapl_without_chunk_cache, dataset_create_plist, dataset_space, dataset_type, filters, flush,
    has_external, layout, new_dcpl, open_dataset, open_file, open_group, remove_filter, set_chunk,
    set_fill_time_never, Cx, Hid,
};
use super::source::{hint_rows, placement, Fds, Source};
use super::{Hdf5Error, Result, BLOCK_BYTES, INDEX_DATASET};
use metfs_tier::pacer::Pacer;

// ---------------------------------------------------------------------------------------------
// Staging.

/// Writes a new HDF5 file at `out` holding rows `rows` (strictly ascending, each below the
/// file's row count) of container `file` of `c`; see the module docs for its layout. Moves
/// each block of rows only after `pacer` admits its bytes. Returns the size of the written
/// file.
///
/// Writes `out` only (created or truncated; removed again on error) and does not fsync it: the
/// caller verifies, fsyncs and renames it into the slot. Fails with
/// [`Hdf5Error::SourceChanged`] when the container differs from what [`open_containers`](super::open_containers) saw,
/// before or after copying. Blocks: run it on a blocking thread.
pub fn stage_rows(
    c: &Containers,
    file: usize,
    rows: &[u64],
    out: &Path,
    pacer: &Pacer,
) -> Result<u64> {
    let cf = c.files.get(file).ok_or_else(|| Hdf5Error::BadRows {
        file: out.display().to_string(),
        reason: format!("file index {file} of {}", c.files.len()),
    })?;
    let bad = |reason: String| Hdf5Error::BadRows {
        file: cf.path.clone(),
        reason,
    };
    if let Some(w) = rows.windows(2).find(|w| w[0] >= w[1]) {
        return Err(bad(format!(
            "not strictly ascending ({} then {})",
            w[0], w[1]
        )));
    }
    if let Some(&last) = rows.last() {
        if last >= cf.rows {
            return Err(bad(format!("row {last} of a file with {} rows", cf.rows)));
        }
    }
    c.check_unchanged(file)?;
    let r = write_rows(c, cf, rows, out, pacer).and_then(|()| {
        c.check_unchanged(file)?;
        std::fs::metadata(out)
            .map(|m| m.len())
            .map_err(|source| Hdf5Error::Io {
                file: out.display().to_string(),
                source,
            })
    });
    if r.is_err() {
        let _ = std::fs::remove_file(out);
    }
    r
}

pub(super) fn write_rows(
    c: &Containers,
    cf: &ContainerFile,
    rows: &[u64],
    out: &Path,
    pacer: &Pacer,
) -> Result<()> {
    let cx = Cx { file: &cf.path };
    let ox = OutCx(out.display().to_string());
    let ocx = Cx { file: &ox.0 };
    let src = open_file(cx, &c.root.join(&cf.path))?;
    let dst = create_file(ocx, out)?;
    {
        // Attributes live on the root group, not on the file id.
        let sr = open_group(cx, src.0, "/")?;
        let dr = open_group(ocx, dst.0, "/")?;
        copy_attrs(cx, ocx, sr.0, dr.0)?;
    }
    for g in &cf.groups {
        let sg = open_group(cx, src.0, g)?;
        let dg = create_group_like(ocx, dst.0, g, sg.0)?;
        copy_attrs(cx, ocx, sg.0, dg.0)?;
    }
    let fd = |p: &Path, shown: &str| {
        std::fs::File::open(p).map_err(|source| Hdf5Error::Io {
            file: shown.to_string(),
            source,
        })
    };
    let fds = Fds {
        src: fd(&c.root.join(&cf.path), &cf.path)?,
        out: fd(out, &ox.0)?,
    };
    // One buffer for every block of every dataset; u64 elements keep it aligned for the
    // pointers variable-length reads put in it.
    let mut buf: Vec<u64> = Vec::new();
    for ds in &cf.datasets {
        copy_dataset_rows(cx, ocx, src.0, dst.0, ds, rows, pacer, &mut buf, &fds)?;
    }
    drop(buf);
    for s in &cf.side {
        copy_object(ocx, src.0, s, dst.0)?;
    }
    write_index(ocx, dst.0, rows)?;
    flush(ocx, dst.0)?;
    drop(dst);
    Ok(())
}

/// Owned name of the output file for error messages.
pub(super) struct OutCx(pub(super) String);

/// Copies every attribute of `from` to `to`, byte for byte in the attribute's own type.
/// Attributes holding references are skipped: they would point into the source file.
pub(super) fn copy_attrs(cx: Cx, ocx: Cx, from: hid_t, to: hid_t) -> Result<()> {
    for i in 0..attr_count(cx, from)? {
        let a = open_attr_by_idx(cx, from, i)?;
        let name = attr_name(cx, a.0)?;
        let shown = name.to_string_lossy();
        let ft = attr_type(cx, a.0)?;
        let (problem, _) = type_traits(ft.0);
        if problem.is_some() {
            tracing::debug!(file = cx.file, attribute = %shown, "attribute holds references; not copied");
            continue;
        }
        // A transient copy: a committed datatype of the source cannot be used in another file.
        let t = type_copy(cx, ft.0)?;
        let space = attr_space(cx, a.0)?;
        copy_attr(cx, ocx, a.0, to, &name, t.0, space.0)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn copy_dataset_rows(
    cx: Cx,
    ocx: Cx,
    src: hid_t,
    dst: hid_t,
    ds: &DatasetInfo,
    rows: &[u64],
    pacer: &Pacer,
    buf: &mut Vec<u64>,
    fds: &Fds,
) -> Result<()> {
    let name = ds.name.as_str();
    // No source chunk cache. Uncompressed chunks are then read piecewise, only the selected
    // rows' bytes; compressed ones are read in whole-chunk spans (below), so each chunk is
    // decompressed once without a cache. With a cache, libhdf5 1.10.8 held memory in
    // proportion to the chunks read (310 MiB for a 128 MiB mini-epoch), whatever its size.
    let dapl = dapl_without_chunk_cache(cx)?;
    let d = open_dataset(cx, src, name, dapl.0)?;
    let ft = dataset_type(cx, d.0)?;
    let t = type_copy(cx, ft.0)?;
    let fspace = dataset_space(cx, d.0)?;
    let rank = ds.trailing.len() + 1;
    let src_max = max_dims(cx, fspace.0, rank)?;
    let nout = rows.len() as u64;

    let (dcpl, out_chunk0, maxdims) = output_plist(cx, ocx, d.0, ds, &src_max, nout)?;
    let mut odims = vec![nout];
    odims.extend_from_slice(&ds.trailing);
    let ospace = simple_space(ocx, &odims, Some(&maxdims))?;
    // Blocks are whole chunks: nothing to keep cached between writes.
    let odapl = dapl_without_chunk_cache(cx)?;
    // Intermediate groups exist already (recreated from the source's).
    let od = create_dataset(ocx, dst, name, t.0, ospace.0, dcpl.0, odapl.0)?;
    copy_attrs(cx, ocx, d.0, od.0)?;

    // Block size: whole output chunks, about BLOCK_BYTES, at least one chunk.
    let mem_row = ds.trailing.iter().product::<u64>() * ds.elem_size;
    let chunks_per_block = (BLOCK_BYTES as u64 / (out_chunk0 * mem_row).max(1)).max(1);
    let block_rows = (chunks_per_block * out_chunk0) as usize;
    let need = (block_rows.min(rows.len()) as u64 * mem_row).div_ceil(8) as usize;
    if buf.len() < need {
        buf.resize(need, 0);
    }
    // Rows of compressed chunks read around the selected ones (see `Source::read_spans`).
    let mut scratch: Vec<u64> = Vec::new();
    let src_rows = space_dims(cx, fspace.0)?
        .and_then(|d| d.first().copied())
        .unwrap_or(0);
    let src = Source {
        cx,
        d: d.0,
        t: t.0,
        fspace: fspace.0,
        ds,
        rows: src_rows,
        mem_row,
    };
    let dest = Dest {
        ocx,
        od: od.0,
        ospace: ospace.0,
    };
    let placement = placement(d.0, ds);
    let blocks: Vec<&[u64]> = rows.chunks(block_rows.max(1)).collect();
    if let Some(b) = blocks.first() {
        hint_rows(d.0, ds, &placement, b, &fds.src);
    }
    let vlen_copy = RowCopy {
        d: d.0,
        fspace: fspace.0,
        t: t.0,
        od: od.0,
        ospace: ospace.0,
        trailing: &ds.trailing,
        name,
    };
    let mut out_row = 0u64;
    for (bi, part) in blocks.iter().enumerate() {
        let len = part.len() as u64;
        pacer.consume_blocking(len * ds.row_bytes);
        // The next block's rows are fetched by the kernel while this one is copied.
        if let Some(next) = blocks.get(bi + 1) {
            hint_rows(d.0, ds, &placement, next, &fds.src);
        }
        if ds.vlen {
            // Read, written and reclaimed in one place: the buffer holds library pointers.
            vlen_copy.copy_vlen(cx, ocx, part, out_row, buf)?;
        } else {
            src.copy_block(&dest, part, out_row, buf, &mut scratch)?;
        }
        out_row += len;
        // Start writing this block back now rather than all of it at the caller's fsync,
        // so reads and writes overlap; this does not wait for the disk.
        metfs_tier::start_writeback(&fds.out, 0, 0);
    }
    Ok(())
}

/// The output dataset's creation properties: the source's (filters with their parameters,
/// fill value, chunk shape), with the chunk's first dimension capped at the row count `nout`;
/// plain contiguous data for a source stored in other files. Returns them with the output's
/// rows per chunk and its maximum dimensions.
fn output_plist(
    cx: Cx,
    ocx: Cx,
    d: hid_t,
    ds: &DatasetInfo,
    src_max: &[u64],
    nout: u64,
) -> Result<(Hid, u64, Vec<u64>)> {
    let name = ds.name.as_str();
    let sdcpl = dataset_create_plist(cx, d)?;
    let fresh = has_external(sdcpl.0)
        || !matches!(
            layout(sdcpl.0),
            H5D_layout_t::H5D_CHUNKED | H5D_layout_t::H5D_CONTIGUOUS | H5D_layout_t::H5D_COMPACT
        );
    let dcpl = if fresh {
        // Virtual or external storage refers to other files: stage plain contiguous data.
        new_dcpl(cx)?
    } else {
        copy_plist(cx, sdcpl.0)?
    };
    let mut out_chunk0 = 1u64;
    let mut maxdims = src_max.to_vec();
    maxdims[0] = nout;
    if let (Some(chunk), false) = (&ds.chunk, fresh) {
        let mut oc = chunk.clone();
        oc[0] = oc[0].min(nout.max(1));
        out_chunk0 = oc[0];
        if nout == 0 || src_max[0] == H5S_UNLIMITED {
            maxdims[0] = H5S_UNLIMITED;
        }
        set_chunk(ocx, name, dcpl.0, &oc)?;
        for f in &ds.dropped_filters {
            tracing::debug!(file = cx.file, dataset = name, filter = %f, "filter cannot encode; staged without it");
        }
        if !ds.dropped_filters.is_empty() {
            for (id, _, _, enc) in filters(cx, sdcpl.0)? {
                if !enc {
                    remove_filter(dcpl.0, id);
                }
            }
        }
    } else {
        maxdims[1..].copy_from_slice(&ds.trailing);
    }
    if !ds.vlen {
        // Every element gets written: filling storage first would write it twice.
        set_fill_time_never(dcpl.0);
    }
    Ok((dcpl, out_chunk0, maxdims))
}

/// Where a block of rows is written: the output file's dataset and its dataspace.
struct Dest<'a> {
    ocx: Cx<'a>,
    od: hid_t,
    ospace: hid_t,
}

impl Source<'_> {
    /// Copies the rows `part` of a fixed-size dataset through `buf` into `dest` from output
    /// row `out_row` on (compressed chunks read in whole-chunk spans, through `scratch`).
    fn copy_block(
        &self,
        dest: &Dest,
        part: &[u64],
        out_row: u64,
        buf: &mut [u64],
        scratch: &mut Vec<u64>,
    ) -> Result<()> {
        let name = self.ds.name.as_str();
        let len = part.len() as u64;
        let rank = self.ds.trailing.len() + 1;
        let mut start = vec![0; rank];
        start[0] = out_row;
        let count = vec![1; rank];
        let mut block = vec![0; rank];
        block[0] = len;
        block[1..].copy_from_slice(&self.ds.trailing);
        let mut mdims = vec![len];
        mdims.extend_from_slice(&self.ds.trailing);
        let mspace = simple_space(self.cx, &mdims, None)?;
        match (!self.ds.filters.is_empty(), &self.ds.chunk) {
            (true, Some(c)) => self.read_spans(part, c[0].max(1), buf, scratch)?,
            _ => self.read_runs(part, mspace.0, buf)?,
        }
        // The write takes the whole buffer.
        select_all(mspace.0);
        select_hyperslab(
            dest.ocx,
            || format!("select rows of `{name}`"),
            dest.ospace,
            &start,
            &count,
            Some(&block),
        )?;
        write(
            dest.ocx,
            || format!("write rows of `{name}`"),
            dest.od,
            Some(mspace.0),
            Some(dest.ospace),
            self.t,
            buf,
        )?;
        Ok(())
    }
}

/// Writes `metfs_index`: the source row of each output row.
pub(super) fn write_index(ocx: Cx, dst: hid_t, rows: &[u64]) -> Result<()> {
    let space = simple_space(ocx, &[rows.len() as u64], None)?;
    let d = create_dataset(
        ocx,
        dst,
        INDEX_DATASET,
        std_u64le(),
        space.0,
        H5P_DEFAULT,
        H5P_DEFAULT,
    )?;
    if rows.is_empty() {
        return Ok(());
    }
    write(
        ocx,
        || format!("write `{INDEX_DATASET}`"),
        d.0,
        None,
        None,
        native(Native::U64),
        rows,
    )
}
