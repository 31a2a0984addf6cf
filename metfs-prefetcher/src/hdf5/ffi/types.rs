//! Datatypes: what a type is, and whether its values can be copied byte for byte.

use std::ffi::CStr;
use std::os::raw::{c_char, c_uint};

use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5t::{self, H5T_class_t, H5T_sign_t, H5T_str_t};

use super::{locked, Cx, Hid};
use crate::hdf5::Result;

/// A transient copy of datatype `t` (usable in another file, unlike a committed type).
pub(in crate::hdf5) fn type_copy(cx: Cx, t: hid_t) -> Result<Hid> {
    // SAFETY: takes an id by value; the library checks it.
    cx.id(|| "copy datatype".into(), || unsafe { h5t::H5Tcopy(t) })
}

/// Bytes of one value of type `t` (for variable-length types, of its handle).
pub(in crate::hdf5) fn type_size(t: hid_t) -> usize {
    // SAFETY: takes an id by value; the library checks it (0 on failure).
    locked(|| unsafe { h5t::H5Tget_size(t) })
}

/// Class of type `t`.
pub(in crate::hdf5) fn type_class(t: hid_t) -> H5T_class_t {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5t::H5Tget_class(t) })
}

/// Sign of integer type `t`.
pub(in crate::hdf5) fn type_sign(t: hid_t) -> H5T_sign_t {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5t::H5Tget_sign(t) })
}

/// Padding of fixed-length string type `t`.
pub(in crate::hdf5) fn type_strpad(t: hid_t) -> H5T_str_t {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5t::H5Tget_strpad(t) })
}

/// True when `t` is a variable-length string type.
pub(in crate::hdf5) fn is_variable_str(t: hid_t) -> bool {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5t::H5Tis_variable_str(t) }) > 0
}

/// The library's native types, for reading labels.
pub(in crate::hdf5) enum Native {
    U64,
    I64,
    F32,
    F64,
}

/// The id of a native type (owned by the library, not to be closed).
pub(in crate::hdf5) fn native(n: Native) -> hid_t {
    // Global type ids, which the `hdf5` crate initialises on first use (under the lock).
    locked(|| match n {
        Native::U64 => *h5t::H5T_NATIVE_UINT64,
        Native::I64 => *h5t::H5T_NATIVE_INT64,
        Native::F32 => *h5t::H5T_NATIVE_FLOAT,
        Native::F64 => *h5t::H5T_NATIVE_DOUBLE,
    })
}

/// The file type of a little-endian `u64` (owned by the library, not to be closed).
pub(in crate::hdf5) fn std_u64le() -> hid_t {
    // A global type id, which the `hdf5` crate initialises on first use (under the lock).
    locked(|| *h5t::H5T_STD_U64LE)
}

/// Name of the member of enum type `t` whose value is the bytes `val`.
pub(in crate::hdf5) fn enum_name(cx: Cx, t: hid_t, val: &[u8]) -> Result<String> {
    if val.len() < type_size(t) {
        return Err(cx.lib("enum value name", "value shorter than its type"));
    }
    let mut name = [0 as c_char; 256];
    cx.call(
        || "enum value name".into(),
        // SAFETY: `val` holds at least one value of `t` (checked above), which is what the
        // library reads; it writes at most `name.len()` bytes, NUL-terminated, into `name`.
        || unsafe { h5t::H5Tenum_nameof(t, val.as_ptr().cast(), name.as_mut_ptr(), name.len()) },
    )?;
    name[name.len() - 1] = 0;
    // SAFETY: `name` holds a NUL (at the latest the one just set) and outlives the borrow.
    Ok(unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// What stands in the way of copying values of type `t` byte for byte into another file, and
/// whether it holds variable-length data (which needs reclaiming after each read).
pub(in crate::hdf5) fn type_traits(t: hid_t) -> (Option<&'static str>, bool) {
    // SAFETY: takes an id and a class by value; the library checks the id.
    let detect = |c| locked(|| unsafe { h5t::H5Tdetect_class(t, c) }) > 0;
    if detect(H5T_class_t::H5T_REFERENCE) {
        return (
            Some("it holds object or region references, which would point into the source file"),
            false,
        );
    }
    let vlen = is_variable_str(t) || detect(H5T_class_t::H5T_VLEN) || has_vlen_string(t);
    (None, vlen)
}

/// Variable-length strings nested in compounds or arrays (`H5Tdetect_class` reports them as
/// strings, not as variable-length data).
fn has_vlen_string(t: hid_t) -> bool {
    match type_class(t) {
        H5T_class_t::H5T_STRING => is_variable_str(t),
        H5T_class_t::H5T_COMPOUND => {
            // SAFETY: takes an id by value; the library checks it.
            let n = locked(|| unsafe { h5t::H5Tget_nmembers(t) }).max(0) as c_uint;
            (0..n).any(|i| {
                // SAFETY: takes an id and an index; the library checks both.
                let m = locked(|| unsafe { h5t::H5Tget_member_type(t, i) });
                m >= 0 && has_vlen_string(Hid(m).0)
            })
        }
        H5T_class_t::H5T_ARRAY | H5T_class_t::H5T_VLEN => {
            // SAFETY: takes an id by value; the library checks it.
            let b = locked(|| unsafe { h5t::H5Tget_super(t) });
            b >= 0 && has_vlen_string(Hid(b).0)
        }
        _ => false,
    }
}

/// A short numpy-like name of type `t`: `float32`, `int64`, `uint8`, `|S16`, `vlen str`, ….
pub(in crate::hdf5) fn describe_type(t: hid_t) -> String {
    let size = type_size(t);
    match type_class(t) {
        H5T_class_t::H5T_INTEGER => {
            let unsigned = type_sign(t) == H5T_sign_t::H5T_SGN_NONE;
            format!("{}int{}", if unsigned { "u" } else { "" }, size * 8)
        }
        H5T_class_t::H5T_FLOAT => format!("float{}", size * 8),
        H5T_class_t::H5T_STRING if is_variable_str(t) => "vlen str".into(),
        H5T_class_t::H5T_STRING => format!("|S{size}"),
        H5T_class_t::H5T_COMPOUND => format!("compound({size} bytes)"),
        H5T_class_t::H5T_ENUM => format!("enum({size} bytes)"),
        H5T_class_t::H5T_ARRAY => format!("array({size} bytes)"),
        H5T_class_t::H5T_VLEN => "vlen".into(),
        H5T_class_t::H5T_OPAQUE => format!("opaque({size} bytes)"),
        H5T_class_t::H5T_BITFIELD => format!("bitfield({size} bytes)"),
        H5T_class_t::H5T_REFERENCE => "reference".into(),
        _ => format!("other({size} bytes)"),
    }
}
