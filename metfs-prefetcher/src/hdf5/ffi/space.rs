//! Dataspaces: shapes, extents and row selections.

use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5s::{self, H5S_seloper_t};

use super::{locked, Cx, Hid};
use crate::hdf5::Result;

/// Rank of a simple dataspace; `None` when `space` is not a valid dataspace.
pub(in crate::hdf5) fn rank(space: hid_t) -> Option<usize> {
    // SAFETY: takes an id by value; the library checks it.
    let r = locked(|| unsafe { h5s::H5Sget_simple_extent_ndims(space) });
    usize::try_from(r).ok()
}

/// Elements in the whole extent of `space` (0 when it is not a valid dataspace).
pub(in crate::hdf5) fn extent_points(space: hid_t) -> u64 {
    // SAFETY: takes an id by value; the library checks it.
    let n = locked(|| unsafe { h5s::H5Sget_simple_extent_npoints(space) });
    u64::try_from(n).unwrap_or(0)
}

/// Dimensions of a dataspace; `None` for a null dataspace (no elements, no shape).
pub(in crate::hdf5) fn space_dims(cx: Cx, space: hid_t) -> Result<Option<Vec<u64>>> {
    // SAFETY: takes an id by value; the library checks it.
    let class = locked(|| unsafe { h5s::H5Sget_simple_extent_type(space) });
    if class == h5s::H5S_class_t::H5S_NULL {
        return Ok(None);
    }
    let rank = cx.call(
        || "dataspace rank".into(),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5s::H5Sget_simple_extent_ndims(space) },
    )?;
    let mut dims = vec![0u64; rank as usize];
    if rank > 0 {
        cx.call(
            || "dataspace dims".into(),
            // SAFETY: `dims` holds `rank` elements, what the library writes; no max dims.
            || unsafe {
                h5s::H5Sget_simple_extent_dims(space, dims.as_mut_ptr(), std::ptr::null_mut())
            },
        )?;
    }
    Ok(Some(dims))
}

/// Maximum dimensions of a dataspace of rank `rank`.
pub(in crate::hdf5) fn max_dims(cx: Cx, space: hid_t, rank: usize) -> Result<Vec<u64>> {
    let mut dims = vec![0u64; rank];
    let mut maxd = vec![0u64; rank];
    if rank > 0 {
        if self::rank(space) != Some(rank) {
            return Err(cx.lib("dataspace max dims", format!("not of rank {rank}")));
        }
        cx.call(
            || "dataspace max dims".into(),
            // SAFETY: both arrays hold `rank` elements, the rank of `space` (checked above).
            || unsafe {
                h5s::H5Sget_simple_extent_dims(space, dims.as_mut_ptr(), maxd.as_mut_ptr())
            },
        )?;
    }
    Ok(maxd)
}

/// A new simple dataspace of shape `dims` (maximum `maxdims`, of the same rank, or `dims`).
pub(in crate::hdf5) fn simple_space(cx: Cx, dims: &[u64], maxdims: Option<&[u64]>) -> Result<Hid> {
    if maxdims.is_some_and(|m| m.len() != dims.len()) {
        return Err(cx.lib(format!("dataspace {dims:?}"), "maximum of another rank"));
    }
    cx.id(
        || format!("dataspace {dims:?}"),
        // SAFETY: the library reads `dims.len()` elements from each array (lengths checked).
        || unsafe {
            h5s::H5Screate_simple(
                dims.len() as i32,
                dims.as_ptr(),
                maxdims.map_or(std::ptr::null(), |m| m.as_ptr()),
            )
        },
    )
}

/// Selects the regular hyperslab of `space` starting at `start`, `count` blocks of `block`
/// (unit blocks when `None`), replacing any selection. Each array must have the space's rank.
pub(in crate::hdf5) fn select_hyperslab(
    cx: Cx,
    what: impl FnOnce() -> String,
    space: hid_t,
    start: &[u64],
    count: &[u64],
    block: Option<&[u64]>,
) -> Result<()> {
    let r = rank(space);
    if r != Some(start.len())
        || count.len() != start.len()
        || block.is_some_and(|b| b.len() != start.len())
    {
        return Err(cx.lib(
            what(),
            format!(
                "selection of rank {} for a dataspace of rank {r:?}",
                start.len()
            ),
        ));
    }
    cx.call(what, || {
        // SAFETY: the library reads rank elements from each array; all have that length.
        unsafe {
            h5s::H5Sselect_hyperslab(
                space,
                H5S_seloper_t::H5S_SELECT_SET,
                start.as_ptr(),
                std::ptr::null(),
                count.as_ptr(),
                block.map_or(std::ptr::null(), |b| b.as_ptr()),
            )
        }
    })
    .map(|_| ())
}

/// Selects the whole extent of `space`.
pub(in crate::hdf5) fn select_all(space: hid_t) {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5s::H5Sselect_all(space) });
}

/// Runs of consecutive values in ascending `rows`: (first, length).
pub(in crate::hdf5) fn runs(rows: &[u64]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= rows.len() {
            return None;
        }
        let start = rows[i];
        let mut len = 1;
        while i + (len as usize) < rows.len() && rows[i + len as usize] == start + len {
            len += 1;
        }
        i += len as usize;
        Some((start, len))
    })
}
