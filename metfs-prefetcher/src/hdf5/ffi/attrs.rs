//! Attributes: listing, opening, and copying their values.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;

use hdf5_sys::h5::{H5_index_t, H5_iter_order_t};
use hdf5_sys::h5a;
use hdf5_sys::h5d;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;

use super::space::extent_points;
use super::types::type_size;
use super::{locked, Cx, Hid};
use crate::hdf5::Result;

/// Number of attributes of `obj`.
pub(in crate::hdf5) fn attr_count(cx: Cx, obj: hid_t) -> Result<u64> {
    #[allow(deprecated)]
    let n = cx.call(
        || "count attributes".into(),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5a::H5Aget_num_attrs(obj) },
    )?;
    Ok(n as u64)
}

/// Attribute `i` of `obj`, in creation order when the object tracks it, else in name order
/// (h5py's default listing order), so that copies list their attributes as the source does.
pub(in crate::hdf5) fn open_attr_by_idx(cx: Cx, obj: hid_t, i: u64) -> Result<Hid> {
    let dot = c".";
    let open = |order| {
        // SAFETY: `dot` is a NUL-terminated static; ids and the index are checked.
        unsafe {
            h5a::H5Aopen_by_idx(
                obj,
                dot.as_ptr(),
                order,
                H5_iter_order_t::H5_ITER_INC,
                i,
                H5P_DEFAULT,
                H5P_DEFAULT,
            )
        }
    };
    let crt = locked(|| open(H5_index_t::H5_INDEX_CRT_ORDER));
    if crt >= 0 {
        return Ok(Hid(crt));
    }
    cx.id(
        || format!("open attribute #{i}"),
        || open(H5_index_t::H5_INDEX_NAME),
    )
}

/// Name of attribute `a`.
pub(in crate::hdf5) fn attr_name(cx: Cx, a: hid_t) -> Result<CString> {
    let mut buf = vec![0 as c_char; 1024];
    // SAFETY: the library writes at most `buf.len()` bytes, NUL-terminated, into `buf`.
    let len = locked(|| unsafe { h5a::H5Aget_name(a, buf.len(), buf.as_mut_ptr()) });
    if len < 0 {
        return Err(cx.lib("attribute name", "failed"));
    }
    if len as usize >= buf.len() {
        buf = vec![0 as c_char; len as usize + 1];
        // SAFETY: as above, with room for the whole name.
        locked(|| unsafe { h5a::H5Aget_name(a, buf.len(), buf.as_mut_ptr()) });
    }
    let last = buf.len() - 1;
    buf[last] = 0;
    // SAFETY: `buf` holds a NUL (at the latest the one just set) and outlives the borrow.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_owned())
}

/// Names of the attributes of `obj`, in the order [`open_attr_by_idx`] lists them.
pub(in crate::hdf5) fn attr_names(cx: Cx, obj: hid_t) -> Result<Vec<String>> {
    let n = attr_count(cx, obj)?;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let a = open_attr_by_idx(cx, obj, i)?;
        out.push(attr_name(cx, a.0)?.to_string_lossy().into_owned());
    }
    Ok(out)
}

/// True when `obj` has an attribute `name`.
pub(in crate::hdf5) fn attr_exists(cx: Cx, obj: hid_t, name: &CStr) -> Result<bool> {
    cx.call(
        || format!("look up attribute `{}`", name.to_string_lossy()),
        // SAFETY: `name` is NUL-terminated and outlives the call; the id is checked.
        || unsafe { h5a::H5Aexists(obj, name.as_ptr()) },
    )
    .map(|r| r > 0)
}

/// Opens attribute `name` of `obj`.
pub(in crate::hdf5) fn open_attr(cx: Cx, obj: hid_t, name: &CStr) -> Result<Hid> {
    cx.id(
        || format!("open attribute `{}`", name.to_string_lossy()),
        // SAFETY: `name` is NUL-terminated and outlives the call; the id is checked.
        || unsafe { h5a::H5Aopen(obj, name.as_ptr(), H5P_DEFAULT) },
    )
}

/// The dataspace of attribute `a`.
pub(in crate::hdf5) fn attr_space(cx: Cx, a: hid_t) -> Result<Hid> {
    // SAFETY: takes an id by value; the library checks it.
    cx.id(
        || "attribute dataspace".into(),
        || unsafe { h5a::H5Aget_space(a) },
    )
}

/// The datatype of attribute `a`.
pub(in crate::hdf5) fn attr_type(cx: Cx, a: hid_t) -> Result<Hid> {
    // SAFETY: takes an id by value; the library checks it.
    cx.id(
        || "attribute datatype".into(),
        || unsafe { h5a::H5Aget_type(a) },
    )
}

/// Creates attribute `name` on `to` with type `t` and dataspace `space`, and copies the value
/// of attribute `from` (of the same type and dataspace) into it byte for byte.
/// Variable-length parts are read into memory the library allocates, written, and reclaimed
/// here.
pub(in crate::hdf5) fn copy_attr(
    cx: Cx,
    ocx: Cx,
    from: hid_t,
    to: hid_t,
    name: &CStr,
    t: hid_t,
    space: hid_t,
) -> Result<()> {
    let shown = name.to_string_lossy();
    let na = ocx.id(
        || format!("create attribute `{shown}`"),
        // SAFETY: `name` is NUL-terminated and outlives the call; ids are checked.
        || unsafe { h5a::H5Acreate2(to, name.as_ptr(), t, space, H5P_DEFAULT, H5P_DEFAULT) },
    )?;
    let npoints = extent_points(space) as usize;
    if npoints == 0 {
        return Ok(());
    }
    // The attribute's space is `space` (checked): the read fills exactly npoints values.
    let from_space = super::attrs::attr_space(cx, from)?;
    if extent_points(from_space.0) as usize != npoints {
        return Err(cx.lib(format!("read attribute `{shown}`"), "dataspace differs"));
    }
    // u64 elements keep the buffer aligned for the pointers variable-length values hold;
    // zeroed, so that a reclaim after a failed read frees nothing it did not allocate.
    let mut buf = vec![0u64; (npoints * type_size(t)).div_ceil(8)];
    let r = cx.call(
        || format!("read attribute `{shown}`"),
        // SAFETY: `buf` holds npoints values of `t`, the whole attribute, what the library
        // writes.
        || unsafe { h5a::H5Aread(from, t, buf.as_mut_ptr().cast()) },
    );
    let w = r.and_then(|_| {
        ocx.call(
            || format!("write attribute `{shown}`"),
            // SAFETY: `buf` holds npoints values of `t` as the read left them (variable-length
            // handles point at memory the library allocated), what the library reads.
            || unsafe { h5a::H5Awrite(na.0, t, buf.as_ptr().cast()) },
        )
    });
    // SAFETY: `buf` holds values of `t` over `space`, each handle null (zeroed) or allocated by
    // the read above, and nothing else has touched it; a no-op for fixed-size types.
    locked(|| unsafe {
        #[allow(deprecated)]
        h5d::H5Dvlen_reclaim(t, space, H5P_DEFAULT, buf.as_mut_ptr().cast());
    });
    w.map(|_| ())
}
