//! Staging: a new HDF5 file holding one mini-epoch's rows of one container.

use std::ffi::CStr;
use std::os::raw::c_char;
use std::path::Path;

use hdf5_sys::h5::hsize_t;
use hdf5_sys::h5d::{self, H5D_fill_time_t, H5D_layout_t};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::{H5S_seloper_t, H5S_ALL, H5S_UNLIMITED};
use hdf5_sys::{h5a, h5f, h5g, h5o, h5p, h5s, h5t};

use super::containers::{ContainerFile, Containers, DatasetInfo};
use super::ffi::{
    close_on_exec, cstring, filters, locked, max_dims, open_attr_by_idx, open_dataset, open_file,
    simple_space, space_dims, type_traits, Cx,
};
use super::source::{hint_rows, placement, Fds, Source};
use super::*;
use crate::pacer::Pacer;

// ---------------------------------------------------------------------------------------------
// Staging.

/// Writes a new HDF5 file at `out` holding rows `rows` (strictly ascending, each below the
/// file's row count) of container `file` of `c`; see the module docs for its layout. Moves
/// each block of rows only after `pacer` admits its bytes. Returns the size of the written
/// file.
///
/// Writes `out` only (created or truncated; removed again on error) and does not fsync it: the
/// caller verifies, fsyncs and renames it into the slot. Fails with
/// [`Hdf5Error::SourceChanged`] when the container differs from what [`open_containers`] saw,
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
    let src = open_file(cx, &c.root.join(&cf.path), H5P_DEFAULT)?;
    let cout = cstring(ocx, &out.to_string_lossy())?;
    let dst = ocx.id(
        || "create".into(),
        || unsafe { h5f::H5Fcreate(cout.as_ptr(), h5f::H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT) },
    )?;
    close_on_exec(dst.0);
    {
        // Attributes live on the root group, not on the file id.
        let root = c"/";
        let sr = cx.id(
            || "open root group".into(),
            || unsafe { h5g::H5Gopen2(src.0, root.as_ptr(), H5P_DEFAULT) },
        )?;
        let dr = ocx.id(
            || "open root group".into(),
            || unsafe { h5g::H5Gopen2(dst.0, root.as_ptr(), H5P_DEFAULT) },
        )?;
        copy_attrs(cx, ocx, sr.0, dr.0)?;
    }
    for g in &cf.groups {
        let cg = cstring(cx, g)?;
        let sg = cx.id(
            || format!("open group `{g}`"),
            || unsafe { h5g::H5Gopen2(src.0, cg.as_ptr(), H5P_DEFAULT) },
        )?;
        let gcpl = cx.id(
            || format!("group `{g}` properties"),
            || unsafe { h5g::H5Gget_create_plist(sg.0) },
        )?;
        let dg = ocx.id(
            || format!("create group `{g}`"),
            || unsafe { h5g::H5Gcreate2(dst.0, cg.as_ptr(), H5P_DEFAULT, gcpl.0, H5P_DEFAULT) },
        )?;
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
        let cs = cstring(cx, s)?;
        ocx.call(
            || format!("copy dataset `{s}`"),
            || unsafe {
                h5o::H5Ocopy(
                    src.0,
                    cs.as_ptr(),
                    dst.0,
                    cs.as_ptr(),
                    H5P_DEFAULT,
                    H5P_DEFAULT,
                )
            },
        )?;
    }
    write_index(ocx, dst.0, rows)?;
    ocx.call(
        || "flush".into(),
        || unsafe { h5f::H5Fflush(dst.0, h5f::H5F_scope_t::H5F_SCOPE_LOCAL) },
    )?;
    drop(dst);
    Ok(())
}

/// Owned name of the output file for error messages.
pub(super) struct OutCx(pub(super) String);

/// Copies every attribute of `from` to `to`, byte for byte in the attribute's own type.
/// Attributes holding references are skipped: they would point into the source file.
pub(super) fn copy_attrs(cx: Cx, ocx: Cx, from: hid_t, to: hid_t) -> Result<()> {
    #[allow(deprecated)]
    let n = cx.call(
        || "count attributes".into(),
        || unsafe { h5a::H5Aget_num_attrs(from) },
    )?;
    for i in 0..n as u64 {
        let a = open_attr_by_idx(cx, from, i)?;
        let mut name = vec![0 as c_char; 1024];
        let len = locked(|| unsafe { h5a::H5Aget_name(a.0, name.len(), name.as_mut_ptr()) });
        if len < 0 {
            return Err(cx.lib("attribute name", "failed"));
        }
        if len as usize >= name.len() {
            name = vec![0 as c_char; len as usize + 1];
            locked(|| unsafe { h5a::H5Aget_name(a.0, name.len(), name.as_mut_ptr()) });
        }
        let shown = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let ft = cx.id(
            || format!("type of attribute `{shown}`"),
            || unsafe { h5a::H5Aget_type(a.0) },
        )?;
        let (problem, _) = type_traits(ft.0);
        if problem.is_some() {
            tracing::debug!(file = cx.file, attribute = %shown, "attribute holds references; not copied");
            continue;
        }
        // A transient copy: a committed datatype of the source cannot be used in another file.
        let t = cx.id(
            || "copy attribute type".into(),
            || unsafe { h5t::H5Tcopy(ft.0) },
        )?;
        let space = cx.id(
            || "attribute dataspace".into(),
            || unsafe { h5a::H5Aget_space(a.0) },
        )?;
        let npoints =
            locked(|| unsafe { h5s::H5Sget_simple_extent_npoints(space.0) }).max(0) as usize;
        let size = locked(|| unsafe { h5t::H5Tget_size(t.0) });
        let na = ocx.id(
            || format!("create attribute `{shown}`"),
            || unsafe {
                h5a::H5Acreate2(to, name.as_ptr(), t.0, space.0, H5P_DEFAULT, H5P_DEFAULT)
            },
        )?;
        if npoints == 0 {
            continue;
        }
        let mut buf = vec![0u64; (npoints * size).div_ceil(8)];
        cx.call(
            || format!("read attribute `{shown}`"),
            || unsafe { h5a::H5Aread(a.0, t.0, buf.as_mut_ptr().cast()) },
        )?;
        let w = ocx.call(
            || format!("write attribute `{shown}`"),
            || unsafe { h5a::H5Awrite(na.0, t.0, buf.as_ptr().cast()) },
        );
        // Variable-length parts were allocated by the read; a no-op for other types.
        locked(|| unsafe {
            #[allow(deprecated)]
            h5d::H5Dvlen_reclaim(t.0, space.0, H5P_DEFAULT, buf.as_mut_ptr().cast());
        });
        w?;
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
    let filtered = !ds.filters.is_empty();
    let dapl = cx.id(
        || "dataset access properties".into(),
        || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_ACCESS) },
    )?;
    // No source chunk cache. Uncompressed chunks are then read piecewise, only the selected
    // rows' bytes; compressed ones are read in whole-chunk spans (below), so each chunk is
    // decompressed once without a cache. With a cache, libhdf5 1.10.8 held memory in
    // proportion to the chunks read (310 MiB for a 128 MiB mini-epoch), whatever its size.
    cx.call(
        || "chunk cache".into(),
        || unsafe { h5p::H5Pset_chunk_cache(dapl.0, 521, 0, 1.0) },
    )?;
    let d = open_dataset(cx, src, name, dapl.0)?;
    let ft = cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d.0) })?;
    let t = cx.id(|| "copy datatype".into(), || unsafe { h5t::H5Tcopy(ft.0) })?;
    let fspace = cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d.0) })?;
    let rank = ds.trailing.len() + 1;
    let src_max = max_dims(cx, fspace.0, rank)?;
    let nout = rows.len() as u64;

    // Output creation properties: the source's (filters with their parameters, fill value,
    // chunk shape), with the chunk's first dimension capped at the row count.
    let sdcpl = cx.id(
        || "creation properties".into(),
        || unsafe { h5d::H5Dget_create_plist(d.0) },
    )?;
    let layout = locked(|| unsafe { h5p::H5Pget_layout(sdcpl.0) });
    let external = locked(|| unsafe { h5p::H5Pget_external_count(sdcpl.0) }) > 0;
    let fresh = external
        || !matches!(
            layout,
            H5D_layout_t::H5D_CHUNKED | H5D_layout_t::H5D_CONTIGUOUS | H5D_layout_t::H5D_COMPACT
        );
    let dcpl = if fresh {
        // Virtual or external storage refers to other files: stage plain contiguous data.
        cx.id(
            || "creation properties".into(),
            || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_CREATE) },
        )?
    } else {
        cx.id(
            || "copy creation properties".into(),
            || unsafe { h5p::H5Pcopy(sdcpl.0) },
        )?
    };
    let mut out_chunk0 = 1u64;
    let mut maxdims = src_max.clone();
    maxdims[0] = nout;
    if let (Some(chunk), false) = (&ds.chunk, fresh) {
        let mut oc = chunk.clone();
        oc[0] = oc[0].min(nout.max(1));
        out_chunk0 = oc[0];
        if nout == 0 || src_max[0] == H5S_UNLIMITED {
            maxdims[0] = H5S_UNLIMITED;
        }
        ocx.call(
            || format!("chunk shape of `{name}`"),
            || unsafe { h5p::H5Pset_chunk(dcpl.0, rank as i32, oc.as_ptr()) },
        )?;
        for f in &ds.dropped_filters {
            tracing::debug!(file = cx.file, dataset = name, filter = %f, "filter cannot encode; staged without it");
        }
        if !ds.dropped_filters.is_empty() {
            for (id, _, _, enc) in filters(cx, sdcpl.0)? {
                if !enc {
                    locked(|| unsafe { h5p::H5Premove_filter(dcpl.0, id) });
                }
            }
        }
    } else {
        maxdims[1..].copy_from_slice(&ds.trailing);
    }
    if !ds.vlen {
        // Every element gets written: filling storage first would write it twice.
        locked(|| unsafe { h5p::H5Pset_fill_time(dcpl.0, H5D_fill_time_t::H5D_FILL_TIME_NEVER) });
    }
    let mut odims = vec![nout];
    odims.extend_from_slice(&ds.trailing);
    let ospace = simple_space(ocx, &odims, Some(&maxdims))?;
    let odapl = cx.id(
        || "dataset access properties".into(),
        || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_ACCESS) },
    )?;
    // Blocks are whole chunks: nothing to keep cached between writes.
    cx.call(
        || "chunk cache".into(),
        || unsafe { h5p::H5Pset_chunk_cache(odapl.0, 521, 0, 1.0) },
    )?;
    // Intermediate groups exist already (recreated from the source's).
    let cname = cstring(cx, name)?;
    let od = ocx.id(
        || format!("create dataset `{name}`"),
        || unsafe {
            h5d::H5Dcreate2(
                dst,
                cname.as_ptr(),
                t.0,
                ospace.0,
                H5P_DEFAULT,
                dcpl.0,
                odapl.0,
            )
        },
    )?;
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
    let mut start = vec![0 as hsize_t; rank];
    let count = vec![1 as hsize_t; rank];
    let mut block = vec![0 as hsize_t; rank];
    block[1..].copy_from_slice(&ds.trailing);
    let placement = placement(d.0, ds);
    let blocks: Vec<&[u64]> = rows.chunks(block_rows.max(1)).collect();
    if let Some(b) = blocks.first() {
        hint_rows(d.0, ds, &placement, b, &fds.src);
    }
    let mut out_row = 0u64;
    for (bi, part) in blocks.iter().enumerate() {
        let len = part.len() as u64;
        pacer.consume_blocking(len * ds.row_bytes);
        // The next block's rows are fetched by the kernel while this one is copied.
        if let Some(next) = blocks.get(bi + 1) {
            hint_rows(d.0, ds, &placement, next, &fds.src);
        }
        let mut mdims = vec![len];
        mdims.extend_from_slice(&ds.trailing);
        let mspace = simple_space(cx, &mdims, None)?;
        let src = Source {
            cx,
            d: d.0,
            t: t.0,
            fspace: fspace.0,
            ds,
            rows: src_rows,
            mem_row,
        };
        match (filtered && !ds.vlen, &ds.chunk) {
            (true, Some(c)) => src.read_spans(part, c[0].max(1), buf, &mut scratch)?,
            _ => src.read_runs(part, mspace.0, buf)?,
        }
        // The write takes the whole buffer.
        locked(|| unsafe { h5s::H5Sselect_all(mspace.0) });
        start[0] = out_row;
        block[0] = len;
        ocx.call(
            || format!("select rows of `{name}`"),
            || unsafe {
                h5s::H5Sselect_hyperslab(
                    ospace.0,
                    H5S_seloper_t::H5S_SELECT_SET,
                    start.as_ptr(),
                    std::ptr::null(),
                    count.as_ptr(),
                    block.as_ptr(),
                )
            },
        )?;
        let w = ocx.call(
            || format!("write rows of `{name}`"),
            || unsafe {
                h5d::H5Dwrite(
                    od.0,
                    t.0,
                    mspace.0,
                    ospace.0,
                    H5P_DEFAULT,
                    buf.as_ptr().cast(),
                )
            },
        );
        if ds.vlen {
            locked(|| unsafe {
                #[allow(deprecated)]
                h5d::H5Dvlen_reclaim(t.0, mspace.0, H5P_DEFAULT, buf.as_mut_ptr().cast());
            });
        }
        w?;
        out_row += len;
        // Start writing this block back now rather than all of it at the caller's fsync,
        // so reads and writes overlap; this does not wait for the disk.
        crate::tier::start_writeback(&fds.out, 0, 0);
    }
    Ok(())
}

/// Writes `metfs_index`: the source row of each output row.
pub(super) fn write_index(ocx: Cx, dst: hid_t, rows: &[u64]) -> Result<()> {
    let space = simple_space(ocx, &[rows.len() as u64], None)?;
    let name = cstring(ocx, INDEX_DATASET)?;
    let le = locked(|| *h5t::H5T_STD_U64LE);
    let d = ocx.id(
        || format!("create `{INDEX_DATASET}`"),
        || unsafe {
            h5d::H5Dcreate2(
                dst,
                name.as_ptr(),
                le,
                space.0,
                H5P_DEFAULT,
                H5P_DEFAULT,
                H5P_DEFAULT,
            )
        },
    )?;
    if rows.is_empty() {
        return Ok(());
    }
    let native = locked(|| *h5t::H5T_NATIVE_UINT64);
    ocx.call(
        || format!("write `{INDEX_DATASET}`"),
        || unsafe {
            h5d::H5Dwrite(
                d.0,
                native,
                H5S_ALL,
                H5S_ALL,
                H5P_DEFAULT,
                rows.as_ptr().cast(),
            )
        },
    )?;
    Ok(())
}
